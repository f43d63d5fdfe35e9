"""GPUs kept for a yielder the fair policy owes, as the lease table (`agent.core.leases`) asks:
whether a hold keeps a waiter out now, whether a holder's GPUs might be kept for it at its
yield, how long it may keep its turn without asking (`KeepTurn`), and what each hold cost its
yielder (charged as its GPU time). The holds and what is learnt of each tenant's return are
`agent.core.anticipation`'s. Under FIFO and least-recently-served nothing is ever kept.
Pure: no sockets, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from agent.core.anticipation import Anticipation
from agent.core.fair import FairShare
from agent.core.waiters import TenantUsage, Waiter, waiting_on

if TYPE_CHECKING:
    from agent.core.leases import Lease


class Keeping:
    """The keeping of GPUs for yielders, over the table's own `waiters` and `usage` (read, never
    changed here, but for the GPU time a hold costs)."""

    def __init__(
        self,
        fair: FairShare | None,
        anticipation: Anticipation,
        waiters: Mapping[str, Waiter],
        usage: dict[str, TenantUsage],
        clock: Callable[[], float],
    ) -> None:
        self._fair = fair
        self._anticipation = anticipation
        self._waiters = waiters
        self._usage = usage
        self._clock = clock

    def keeps_out(self, waiter: Waiter) -> bool:
        """Whether one of the waiter's GPUs is kept for a yielder the policy serves first."""
        if self._fair is None or not self._anticipation.holds:
            return False
        now, kept = self._clock(), False
        for gpu in waiter.gpus:
            yielder = self._anticipation.held_for(gpu, now)
            if yielder is None or yielder == waiter.tenant_id:
                continue
            window = self._anticipation.window_s  # owed more than the hold can cost it
            if self._fair.ahead_of(yielder, (gpu,), waiter, self._usage, window):
                self._anticipation.kept_out(gpu, now)
                kept = True
        return kept

    def may_keep(self, tenant_id: str, waiter: Waiter) -> bool:
        """Whether the GPUs `tenant_id` holds might be kept for it at its yield, against
        `waiter` (as `keeps_out` decides then: an owed yielder that usually comes back), judged
        from the GPU time counted so far (a turn's own is counted at its end: this errs towards
        keeping)."""
        if self._fair is None or not self._anticipation.comes_back(tenant_id):
            return False
        window = self._anticipation.window_s
        return self._fair.ahead_of(tenant_id, waiter.gpus, waiter, self._usage, window)

    def keep_for(self, lease: Lease) -> float:
        """Seconds from the lease's grant within which its tenant may start another turn on it
        without asking (`KeepTurn`): as long as it would be granted straight back at a yield,
        a whole window more of GPU time included, before everyone waiting for its GPUs; 0 where
        nobody waits (a yield then hands nothing over), where the policy is FIFO, where the
        tenant does not usually come back within the window, or where tiers or owed minimum
        shares order the waiters (their balances move only as turns end)."""
        if self._fair is None or not self._anticipation.comes_back(lease.tenant_id):
            return 0.0
        waiting = [
            w for w in self._waiters.values()
            if w.tenant_id != lease.tenant_id and set(w.gpus) & set(lease.gpus)
        ]  # fmt: skip
        if not waiting:
            return 0.0
        fair = self._fair
        owed = min(fair.keep_s(lease.tenant_id, lease.gpus, w, self._usage) for w in waiting)
        owed -= self._anticipation.window_s  # a whole window more included, as at a yield
        return max(0.0, min(owed, lease.hold_until - lease.granted_at))

    def unhold(self, gpus: Iterable[str], now: float) -> None:
        """End the holds on `gpus`; the time they kept waiters out is their yielder's GPU time."""
        cost: dict[str, tuple[float, list[str]]] = {}
        for tenant, gpu, seconds in self._anticipation.end(gpus, now):
            most, held = cost.get(tenant, (0.0, []))
            cost[tenant] = (max(most, seconds), [*held, gpu])
        for tenant, (seconds, held) in cost.items():
            if self._fair is not None and seconds > 0 and tenant in self._usage:
                on = tuple(held)
                waiting = waiting_on(self._waiters.values(), on)
                self._fair.served(tenant, on, seconds, self._usage, waiting)

"""Anticipation: a GPU waits briefly for a yielder that is owed and usually comes straight back.

A tenant written as a loop (`while True: with baton.turn(): step()`) asks again a moment after
its yield is answered, so whoever waits at the yield would always be granted first, however
little GPU time the yielder has had. After a yield the GPU is therefore kept for the yielder
(as anticipatory disk scheduling and CFQ/BFQ's idling keep a disk for a process that reads
again), for at most `window_s`, and only while all of these hold: the yielder usually comes
back within the window (its mean return time, learnt from every yield to its next request),
the policy would serve it before the waiter it keeps out even after a whole window more of GPU
time (it is owed more than the hold can cost it), and it is still a tenant whose next turn this
node decides (a job's member's is the cluster coordinator's to decide). The time a waiter
was kept out is charged to the yielder as GPU time, so its gaps come out of its own share.
Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

LEARN_RATE = 0.25
"""Weight of the newest return time in the running mean (as the anticipatory scheduler's)."""


@dataclass
class Hold:
    """A GPU kept for the tenant that just yielded it."""

    tenant_id: str
    until: float
    withheld_since: float | None = None
    """When it first kept a waiter out (None: nobody was kept out; then it costs nothing)."""


class Anticipation:
    """Return times per tenant and the holds on the node's GPUs."""

    def __init__(self, window_s: float) -> None:
        if window_s < 0:
            raise ValueError(f"the anticipation window {window_s} cannot be negative")
        self.window_s = window_s
        self.holds: dict[str, Hold] = {}
        self.return_s: dict[str, float] = {}
        """Each tenant's mean time from a yield to its next request."""
        self._yielded_at: dict[str, float] = {}
        self._elsewhere: set[str] = set()

    def yielded(self, tenant_id: str, gpus: Iterable[str], now: float, ago: float = 0.0) -> None:
        """The tenant yielded `gpus` (its caller did `ago` seconds before: a kept turn given
        back only now): keep them for it, until a window after that, if it usually comes back
        in time."""
        if self.window_s <= 0 or tenant_id in self._elsewhere:
            return
        self._yielded_at[tenant_id] = now - ago
        if self.comes_back(tenant_id) and ago < self.window_s:
            for gpu in gpus:
                self.holds[gpu] = Hold(tenant_id, now - ago + self.window_s)

    def decided_elsewhere(self, tenant_id: str) -> None:
        """Another arbiter decides when the tenant's next turn comes (a job's, the cluster
        coordinator): its yields keep no GPU for it, whose return they cannot foresee."""
        self._elsewhere.add(tenant_id)
        self._yielded_at.pop(tenant_id, None)
        self.return_s.pop(tenant_id, None)

    def elsewhere(self, tenant_id: str) -> bool:
        """Whether another arbiter decides the tenant's turns (`decided_elsewhere`)."""
        return tenant_id in self._elsewhere

    def comes_back(self, tenant_id: str) -> bool:
        """Whether GPUs are kept for the tenant after its yields at all: there is a window, and
        the tenant usually asks again within it."""
        return self.window_s > 0 and self.return_s.get(tenant_id, 0.0) <= self.window_s

    def asked(self, tenant_id: str, now: float) -> None:
        """The tenant asks for a turn again: learn how long it was away."""
        at = self._yielded_at.pop(tenant_id, None)
        if at is None:
            return
        away = min(now - at, 2 * self.window_s)  # a long absence counts as a miss, no more
        mean = self.return_s.get(tenant_id)
        self.return_s[tenant_id] = away if mean is None else mean + LEARN_RATE * (away - mean)

    def held_for(self, gpu: str, now: float) -> str | None:
        """The tenant the GPU is kept for now, if any."""
        hold = self.holds.get(gpu)
        return hold.tenant_id if hold is not None and now < hold.until else None

    def kept_out(self, gpu: str, now: float) -> None:
        """The hold on `gpu` kept a waiter out: from now on it costs its tenant GPU time."""
        hold = self.holds[gpu]
        if hold.withheld_since is None:
            hold.withheld_since = now

    def end(self, gpus: Iterable[str], now: float) -> list[tuple[str, str, float]]:
        """Release the holds on `gpus`: `(tenant, gpu, seconds a waiter was kept out)` each."""
        ended = []
        for gpu in gpus:
            hold = self.holds.pop(gpu, None)
            if hold is not None:
                since = hold.withheld_since
                cost = 0.0 if since is None else max(0.0, min(now, hold.until) - since)
                ended.append((hold.tenant_id, gpu, cost))
        return ended

    def gpus_of(self, tenant_id: str) -> list[str]:
        """The GPUs kept for the tenant."""
        return [g for g, hold in self.holds.items() if hold.tenant_id == tenant_id]

    def expired(self, now: float) -> list[str]:
        """The GPUs whose hold ran out."""
        return [g for g, hold in self.holds.items() if hold.until <= now]

    def next_expiry(self) -> float | None:
        """When the soonest hold runs out."""
        return min((hold.until for hold in self.holds.values()), default=None)

    def forget(self, tenant_id: str) -> None:
        """The tenant is gone: what was learnt of it goes too (its holds end by `end`)."""
        self.return_s.pop(tenant_id, None)
        self._yielded_at.pop(tenant_id, None)
        self._elsewhere.discard(tenant_id)

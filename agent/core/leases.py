"""The lease table: who holds which GPU, who waits, in what order. Pure: no sockets, no clock.

Grants are two-phase so that the service can make room before a turn starts: `pick` reserves
the GPUs of the waiters that may go now, then `grant` turns a reservation into a lease (or
`block` puts the waiter back, skipped until `unblock_all`). A multi-GPU waiter takes all its
GPUs at once or none, and the queue order is one global order, so waiters cannot deadlock.
Under the fair policy a GPU may be kept briefly for a yielder it owes (`agent.core.keeping`).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from agent.core.anticipation import Anticipation
from agent.core.errors import AlreadyHolding, NotOwner, UnknownLease
from agent.core.fair import FairShare
from agent.core.keeping import Keeping
from agent.core.policy import POLICIES, Policy
from agent.core.waiters import TenantUsage, Waiter, waiting_on


@dataclass(frozen=True)
class Lease:
    """A granted turn on one or more GPUs."""

    lease_id: str
    tenant_id: str
    gpus: tuple[str, ...]
    tokens: Mapping[str, int]
    granted_at: float
    hold_until: float


@dataclass
class GpuState:
    """One GPU: its holder and its last fencing token."""

    holder: str | None = None
    token: int = 0
    busy_since: float | None = None
    served: dict[str, float] = field(default_factory=dict)
    """When each tenant's last turn on this GPU ended."""


@dataclass
class Tick:
    """What time alone changed: waiters past their deadline, leases held too long."""

    expired: list[Waiter] = field(default_factory=list)
    overdue: list[Lease] = field(default_factory=list)
    unheld: list[str] = field(default_factory=list)
    """GPUs no longer kept for a yielder that did not come back in time."""


class LeaseTable:
    """Per GPU at most one holder; waiters served in the policy's order."""

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        policy: str | Policy = "fifo",
        max_hold: float = 60.0,
        new_id: Callable[[], str] | None = None,
    ) -> None:
        self._clock = clock
        if policy == "fair":
            policy = FairShare()
        self._policy = POLICIES[policy] if isinstance(policy, str) else policy
        self.fair = self._policy if isinstance(self._policy, FairShare) else None
        """The fair policy's state, when that is the policy (it accounts held time and tiers)."""
        self.anticipation = Anticipation(self.fair.config.anticipate_s if self.fair else 0.0)
        """GPUs kept briefly for owed yielders (the fair policy's; off under the others)."""
        self.max_hold = max_hold
        self._new_id = new_id or (lambda: uuid.uuid4().hex[:16])
        self._seq = itertools.count()
        self.gpus: dict[str, GpuState] = {}
        self.leases: dict[str, Lease] = {}
        self.waiters: dict[str, Waiter] = {}
        self.usage: dict[str, TenantUsage] = {}
        self.keeping = Keeping(self.fair, self.anticipation, self.waiters, self.usage, clock)
        """Whether a GPU is kept for a yielder, and how long a holder may keep its turn."""
        self.fair_home: dict[str, tuple[str, ...]] = {}
        """The GPUs each tenant's fair standing was saved against before a restart, until it is
        served, waits or holds here (`fair_gpus`)."""

    # Queries.

    def now(self) -> float:
        """The time on the table's clock."""
        return self._clock()

    def gpu(self, name: str) -> GpuState:
        """The state of a GPU, created on first mention."""
        if (state := self.gpus.get(name)) is None:
            state = self.gpus[name] = GpuState()
        return state

    def _usage_of(self, tenant_id: str) -> TenantUsage:
        if (usage := self.usage.get(tenant_id)) is None:
            usage = self.usage[tenant_id] = TenantUsage()
        return usage

    def queue(self) -> list[Waiter]:
        """All waiters in the order the policy serves them."""
        return self._policy(list(self.waiters.values()), self.usage)

    def queue_of(self, gpu: str) -> list[Waiter]:
        """The waiters for one GPU, in serving order."""
        return [w for w in self.queue() if gpu in w.gpus]

    def lease(self, lease_id: str, tenant_id: str) -> Lease:
        """A lease, checked to belong to `tenant_id`."""
        lease = self.leases.get(lease_id)
        if lease is None:
            raise UnknownLease(f"no lease {lease_id!r}: it was yielded, revoked or never granted")
        if lease.tenant_id != tenant_id:
            raise NotOwner(lease_id, lease.tenant_id)
        return lease

    def fair_gpus(self, tenant_id: str) -> set[str]:
        """The GPUs the tenant's fair standing is judged on: those it was served on, waits for
        or holds here, else those it was restored on after a restart (empty: unknown)."""
        where = {gpu for gpu, state in self.gpus.items() if tenant_id in state.served}
        where.update(
            gpu for w in self.waiters.values() if w.tenant_id == tenant_id for gpu in w.gpus
        )
        where.update(gpu for lease in self.leases_of(tenant_id) for gpu in lease.gpus)
        return where or set(self.fair_home.get(tenant_id, ()))

    def leases_of(self, tenant_id: str) -> list[Lease]:
        """The tenant's current leases."""
        return [lease for lease in self.leases.values() if lease.tenant_id == tenant_id]

    def contended(self, lease: Lease) -> bool:
        """Whether anyone (other than the holder) waits for one of the lease's GPUs."""
        return any(
            w.tenant_id != lease.tenant_id and set(w.gpus) & set(lease.gpus)
            for w in self.waiters.values()
        )

    # Waiting.

    def enqueue(
        self,
        tenant_id: str,
        gpus: Iterable[str],
        *,
        timeout: float | None = None,
        front: bool = False,
        duty: int = 100,
        tier: int | None = None,
    ) -> Waiter:
        """Queue a tenant for all of `gpus` at once."""
        wanted = tuple(sorted(set(gpus)))
        if not wanted:
            raise ValueError("a turn needs at least one GPU")
        for gpu in wanted:
            if self.gpu(gpu).holder is not None and self._holder(gpu).tenant_id == tenant_id:
                raise AlreadyHolding(f"tenant {tenant_id!r} already holds {gpu}")
        for w in self.waiters.values():
            if w.tenant_id == tenant_id and set(w.gpus) & set(wanted):
                raise AlreadyHolding(f"tenant {tenant_id!r} already waits for {', '.join(w.gpus)}")
        now = self._clock()
        usage = self._usage_of(tenant_id)
        usage.duty = duty
        usage.tier = usage.tier if tier is None else tier
        self.keeping.unhold(self.anticipation.gpus_of(tenant_id), now)
        self.anticipation.asked(tenant_id, now)
        if self.fair is not None:
            self.fair.joined(tenant_id, wanted, duty, usage.tier)
        waiter = Waiter(
            waiter_id=self._new_id(),
            tenant_id=tenant_id,
            gpus=wanted,
            seq=next(self._seq),
            enqueued_at=now,
            deadline=None if timeout is None else now + timeout,
            front=front,
        )
        self.waiters[waiter.waiter_id] = waiter
        return waiter

    def cancel(self, waiter_id: str) -> Waiter | None:
        """Remove a waiter (gave up, timed out, disconnected); its reservation goes with it."""
        waiter = self.waiters.pop(waiter_id, None)
        if waiter is not None and waiter.reserved:
            for gpu in waiter.gpus:
                self.gpu(gpu).holder = None
        return waiter

    # Granting.

    def pick(self) -> list[Waiter]:
        """Reserve the GPUs of every waiter that may start now, in serving order."""
        claimed: set[str] = set()
        chosen: list[Waiter] = []
        for waiter in self.queue():
            if waiter.blocked or waiter.reserved:
                continue
            wanted = set(waiter.gpus)
            free = all(self.gpu(g).holder is None for g in wanted)
            if free and not self.keeping.keeps_out(waiter) and not wanted & claimed:
                for gpu in wanted:
                    self.gpu(gpu).holder = waiter.waiter_id
                waiter.reserved = True
                chosen.append(waiter)
            claimed |= wanted
        return chosen

    def grant(self, waiter_id: str) -> Lease:
        """Turn a reservation into a lease with fresh fencing tokens."""
        waiter = self.waiters.pop(waiter_id)
        assert waiter.reserved, "grant() needs a reservation from pick()"
        now = self._clock()
        self.keeping.unhold(waiter.gpus, now)
        tokens = {}
        for gpu in waiter.gpus:
            state = self.gpu(gpu)
            state.token += 1
            state.holder = waiter_id
            state.busy_since = now
            tokens[gpu] = state.token
        lease = Lease(
            lease_id=waiter_id,
            tenant_id=waiter.tenant_id,
            gpus=waiter.gpus,
            tokens=tokens,
            granted_at=now,
            hold_until=now + self.max_hold,
        )
        self.leases[lease.lease_id] = lease
        if self.fair is not None:
            self.fair.started(lease.tenant_id, lease.gpus, self._waiting(lease.gpus), self.usage)
        return lease

    def block(self, waiter_id: str, reason: str) -> None:
        """Undo a reservation that could not be prepared; skip the waiter until `unblock_all`."""
        waiter = self.waiters[waiter_id]
        for gpu in waiter.gpus:
            self.gpu(gpu).holder = None
        waiter.reserved = False
        waiter.blocked = reason or "no room"

    def unblock_all(self) -> bool:
        """The node changed: blocked waiters are eligible again. True if any were blocked."""
        blocked = [w for w in self.waiters.values() if w.blocked]
        for waiter in blocked:
            waiter.blocked = ""
        return bool(blocked)

    # Ending turns.

    def release(self, lease_id: str, *, yielded: bool = False, kept_s: float = 0.0) -> Lease:
        """End a lease (yield, revocation or departure) and record the tenant as served; after
        a yield (its caller's `kept_s` before, for a kept turn) its GPUs may be kept briefly for
        it (`agent.core.anticipation`)."""
        lease = self.leases.pop(lease_id, None)
        if lease is None:
            raise UnknownLease(f"no lease {lease_id!r}")
        now = self._clock()
        for gpu in lease.gpus:
            state = self.gpu(gpu)
            state.holder = None
            state.busy_since = None
            state.served[lease.tenant_id] = now
        usage = self._usage_of(lease.tenant_id)
        usage.last_served = now
        usage.served_seconds += max(0.0, now - lease.granted_at)
        if self.fair is not None:
            self.fair.served(
                lease.tenant_id,
                lease.gpus,
                max(0.0, now - lease.granted_at),
                self.usage,
                self._waiting(lease.gpus),
            )
        if yielded and self.fair is not None:
            ago = min(max(0.0, kept_s), now - lease.granted_at)
            self.anticipation.yielded(lease.tenant_id, lease.gpus, now, ago)
        return lease

    def _waiting(self, gpus: tuple[str, ...]) -> dict[str, set[str]]:
        return waiting_on(self.waiters.values(), gpus)

    def revoke(self, lease_id: str) -> tuple[Lease, list[Waiter], Waiter]:
        """End an overdue lease: reserve its GPUs for the waiters now due (returned), then
        queue the revoked tenant ahead of everyone else for the turn after. The holder is parked
        now: the waiters a failed park (or no room) blocked are tried again, else the turn would
        go straight back to the holder."""
        lease = self.release(lease_id)
        self.unblock_all()
        due = self.pick()
        duty = self.usage[lease.tenant_id].duty
        return lease, due, self.enqueue(lease.tenant_id, lease.gpus, front=True, duty=duty)

    def drop_tenant(
        self, tenant_id: str, gpus: Iterable[str] = (), tier: int = 0
    ) -> tuple[list[Lease], list[Waiter]]:
        """The tenant is gone: release its leases and remove its waiters (the fair policy
        remembers a debt it left with, `FairShare.left`, on its `fair_gpus`, else on `gpus` in
        `tier`, its registration's: a tenant restored after a restart that leaves before its
        first turn there keeps the debt it was restored with)."""
        where = self.fair_gpus(tenant_id)
        mine = [w.waiter_id for w in self.waiters.values() if w.tenant_id == tenant_id]
        removed = [w for w in map(self.cancel, mine) if w is not None]
        leases = [self.release(lease.lease_id) for lease in self.leases_of(tenant_id)]
        self.anticipation.end(self.anticipation.gpus_of(tenant_id), self._clock())
        self.anticipation.forget(tenant_id)
        usage = self.usage.pop(tenant_id, None)
        tier = tier if usage is None else usage.tier
        self.fair_home.pop(tenant_id, None)
        if self.fair is not None:  # its debt outlives it: coming back does not clear it
            self.fair.left(tenant_id, sorted(where or set(gpus)), tier)
        for state in self.gpus.values():
            state.served.pop(tenant_id, None)
        return leases, removed

    # Time.

    def tick(self) -> Tick:
        """Remove waiters past their deadline; list leases past their hold while others wait."""
        now = self._clock()
        result = Tick()
        for waiter in list(self.waiters.values()):
            if waiter.deadline is not None and now >= waiter.deadline and not waiter.reserved:
                self.cancel(waiter.waiter_id)
                result.expired.append(waiter)
        result.unheld = self.anticipation.expired(now)
        self.keeping.unhold(result.unheld, now)
        due = {lease.lease_id: self.revoke_at(lease) for lease in self.leases.values()}
        result.overdue = [
            lease
            for lease in self.leases.values()
            if (at := due[lease.lease_id]) is not None and at <= now
        ]
        return result

    def revoke_at(self, lease: Lease) -> float | None:
        """When the lease may be revoked: past its maximum hold while others wait, or (the fair
        policy's tier grace) for a higher tier's waiter. None: not while nothing changes. A
        tenant whose turns another arbiter decides (a job's member, the cluster coordinator) is
        not revoked for a tier: its job's members on other nodes would go on holding theirs."""
        times = [lease.hold_until] if self.contended(lease) else []
        if self.fair is not None and not self.anticipation.elsewhere(lease.tenant_id):
            tier = self.usage.get(lease.tenant_id, TenantUsage()).tier
            for w in self.waiters.values():
                wtier = self.usage.get(w.tenant_id, TenantUsage()).tier
                at = self.fair.preempt_at(lease.gpus, tier, lease.granted_at, w, wtier)
                if at is not None:
                    times.append(at)
        return min(times, default=None)

    def next_deadline(self, after: float = float("-inf")) -> float | None:
        """The earliest time later than `after` at which `tick` could find something to do."""
        times = [w.deadline for w in self.waiters.values() if w.deadline is not None]
        times += [t for t in map(self.revoke_at, self.leases.values()) if t is not None]
        if (expiry := self.anticipation.next_expiry()) is not None:
            times.append(expiry)
        return min((t for t in times if t > after), default=None)

    # Persistence.

    def restore_lease(self, lease: Lease) -> float:
        """Reinstate a lease loaded from disk (fencing tokens never go backwards); returns
        when, its GPUs' `busy_since`."""
        now = self._clock()
        for gpu in lease.gpus:
            state = self.gpu(gpu)
            state.holder = lease.lease_id
            state.token = max(state.token, lease.tokens.get(gpu, 0))
            state.busy_since = now
        self.leases[lease.lease_id] = replace(lease, tokens=dict(lease.tokens))
        return now

    def _holder(self, gpu: str) -> Lease | Waiter:
        holder = self.gpu(gpu).holder
        assert holder is not None
        return self.leases.get(holder) or self.waiters[holder]

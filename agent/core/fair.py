"""The `fair` queue policy: weighted fair turns over measured GPU time, in priority tiers. Pure.

Within a tier, turns follow a virtual-time fair queue (start-time fair queueing as in CFS or
stride scheduling): a tenant's virtual time grows by the seconds it *held* a turn divided by its
weight (`gpu-duty`), and the waiter with the least virtual time goes first, so each tenant's
share of a contended GPU converges to its duty's share. A tenant that (re)joins is lifted to its
GPU's virtual clock (its tier's) less `credit_s` of its own time, so idle time is banked only up to
`credit_s` (bounded lag); one that left the node in debt (ahead of its GPUs' clock) is remembered
until the clock passes it, so leaving and coming back under the same id sheds no debt. Tiers (the
pod's priority) are strict, except that a lower tier waiting behind a higher one is owed
`min_share` of the GPU's time: its balance grows by `min_share` of each higher-tier turn it waits
through and shrinks by the rest of each turn it takes while a higher tier waits, bounded by
±`credit_s`; a tier with a positive balance goes first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from agent.core.waiters import TenantUsage, Waiter


class Order(NamedTuple):
    """A waiter's place in the fair order: the least goes first."""

    not_owed: bool
    """A tier owed its minimum share goes first."""
    minus_tier: int
    not_front: bool
    """A revoked holder goes first within its tier."""
    vtime: float
    seq: int

    @property
    def before_vtime(self) -> tuple[bool, int, bool]:
        """What orders waiters before their virtual times do."""
        return (self.not_owed, self.minus_tier, self.not_front)


@dataclass(frozen=True)
class FairConfig:
    """What the operator sets for the fair policy."""

    min_share: float = 0.1
    """Share of a GPU's time a lower tier keeps while a higher tier also waits (0 to 0.5)."""
    credit_s: float = 10.0
    """GPU-seconds of credit an idle tenant (or a tier kept waiting) may bank, at most."""
    tier_grace_s: float | None = None
    """Seconds a higher tier's waiter waits before the lower tier's holder is revoked (None:
    never; it gets the GPU at the holder's next yield)."""
    anticipate_s: float = 0.01
    """Seconds a GPU is kept for an owed yielder that usually asks again within them
    (`agent.core.anticipation`; 0: never)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_share <= 0.5:
            raise BadFairConfig("min_share", f"{self.min_share} is outside 0-0.5")
        for name in ("credit_s", "tier_grace_s", "anticipate_s"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise BadFairConfig(name, f"{value} cannot be negative")


class BadFairConfig(ValueError):
    """A `FairConfig` setting out of its range: `field` names it, the message says why."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field} {why}")
        self.field, self.why = field, why


@dataclass
class FairShare:
    """The fair policy's state: each tenant's virtual time, each GPU's virtual clock, and what
    each (GPU, tier) is owed."""

    config: FairConfig = field(default_factory=FairConfig)
    vtime: dict[str, float] = field(default_factory=dict)
    vclock: dict[str, float] = field(default_factory=dict)
    """Each GPU's virtual clock per tier (`clock_key`)."""
    balance: dict[tuple[str, int], float] = field(default_factory=dict)
    departed: dict[str, tuple[tuple[str, ...], int]] = field(default_factory=dict)
    """Tenants that left in debt, oldest first: the GPUs and tier whose clock must pass their
    virtual time before it is forgotten (at most `DEPARTED_MAX`)."""

    def __call__(self, waiters: list[Waiter], usage: Mapping[str, TenantUsage]) -> list[Waiter]:
        """Owed lower tiers first, then by tier (highest first), a revoked holder first within
        its tier, then least virtual time, then arrival."""
        if len(waiters) < 2:  # (the usual handover: nobody else to order it against)
            return waiters
        return sorted(waiters, key=lambda w: self._key(w, usage, self.vtime.get(w.tenant_id, 0.0)))

    def ahead_of(
        self,
        tenant_id: str,
        gpus: Iterable[str],
        waiter: Waiter,
        usage: Mapping[str, TenantUsage],
        extra_s: float = 0.0,
    ) -> bool:
        """Whether `tenant_id`, asking again now for `gpus`, would be served before `waiter`,
        even after `extra_s` more seconds of GPU time."""
        gpus = tuple(gpus)
        me = usage.get(tenant_id) or _NOBODY
        vtime = self._rejoined(tenant_id, gpus, me.duty, me.tier) + extra_s / _weight(me.duty)
        mine = self._order(tenant_id, gpus, False, waiter.seq + 1, usage, vtime)
        return mine < self._key(waiter, usage, self.vtime.get(waiter.tenant_id, 0.0))

    def keep_s(
        self, tenant_id: str, gpus: Iterable[str], waiter: Waiter, usage: Mapping[str, TenantUsage]
    ) -> float:
        """Seconds of GPU time after which `tenant_id` (holding `gpus`, its turn not counted yet)
        would no longer be served before `waiter` if it yielded and asked again: `ahead_of` holds
        for every `extra_s` below it. 0 unless both are served by virtual time alone (same tier,
        nobody owed a minimum share, `waiter` no revoked holder)."""
        gpus = tuple(gpus)
        me = usage.get(tenant_id) or _NOBODY
        theirs = self._key(waiter, usage, self.vtime.get(waiter.tenant_id, 0.0))
        mine_before = self._order(tenant_id, gpus, False, waiter.seq + 1, usage, 0.0).before_vtime
        if mine_before != theirs.before_vtime or not theirs.not_owed:
            return 0.0  # ordered by tier, by a minimum share owed, or a revoked holder first
        mine = self._rejoined(tenant_id, gpus, me.duty, me.tier)
        return max(0.0, (theirs.vtime - mine) * _weight(me.duty))

    def _key(self, w: Waiter, usage: Mapping[str, TenantUsage], vtime: float) -> Order:
        return self._order(w.tenant_id, w.gpus, w.front, w.seq, usage, vtime)

    def _order(
        self,
        tenant_id: str,
        gpus: Iterable[str],
        front: bool,
        seq: int,
        usage: Mapping[str, TenantUsage],
        vtime: float,
    ) -> Order:
        tier = _tier(usage, tenant_id)
        owed = bool(self.balance) and any(self.balance.get((g, tier), 0.0) > 0 for g in gpus)
        return Order(not owed, -tier, not front, vtime, seq)

    def joined(self, tenant_id: str, gpus: Iterable[str], duty: int, tier: int = 0) -> None:
        """A tenant starts waiting: a new one starts at its GPUs' virtual clock (its tier's), a
        returning one keeps at most `credit_s` of banked time."""
        self.vtime[tenant_id] = self._rejoined(tenant_id, gpus, duty, tier)
        self.departed.pop(tenant_id, None)

    def left(self, tenant_id: str, gpus: Iterable[str], tier: int) -> None:
        """A tenant left the node (its last session ended, its pod went): its virtual time is
        kept while it is ahead of its GPUs' clock (it owes the others), so that coming back
        under the same id it rejoins where it left; else forgotten (it would rejoin at the
        clock, as a new tenant does). The debts of others that left and have since been paid
        are forgotten too, and the oldest beyond `DEPARTED_MAX`."""
        if tenant_id not in self.departed:
            self.departed[tenant_id] = (tuple(gpus), tier)
        for t, (t_gpus, t_tier) in list(self.departed.items()):
            if not self._in_debt(t, t_gpus, t_tier):
                self._forget(t)
        while len(self.departed) > DEPARTED_MAX:
            self._forget(next(iter(self.departed)))

    def _forget(self, tenant_id: str) -> None:
        self.departed.pop(tenant_id, None)
        self.vtime.pop(tenant_id, None)

    def _in_debt(self, tenant_id: str, gpus: Iterable[str], tier: int) -> bool:
        clock = max((self.vclock.get(clock_key(g, tier), 0.0) for g in gpus), default=_NEVER)
        return self.vtime.get(tenant_id, 0.0) > clock

    def _rejoined(self, tenant_id: str, gpus: Iterable[str], duty: int, tier: int) -> float:
        clock = max((self.vclock.get(clock_key(g, tier), 0.0) for g in gpus), default=0.0)
        floor = clock - self.config.credit_s / _weight(duty)
        return max(self.vtime.get(tenant_id, clock), floor)

    def started(
        self,
        tenant_id: str,
        gpus: Iterable[str],
        waiting: Mapping[str, set[str]],
        usage: Mapping[str, TenantUsage],
    ) -> None:
        """A turn began: each GPU's virtual clock of the holder's tier reaches the least virtual
        time of the holder and its tier's waiters, so those who (re)join during the turn are not
        floored against a stale one. (Another tier's waiters, whose virtual times drift apart
        from this tier's, would hold it back, and its sleepers would bank more than the credit.)"""
        tier = _tier(usage, tenant_id)
        for gpu in gpus:
            others = {t for t in waiting.get(gpu, ()) if t != tenant_id and _tier(usage, t) == tier}
            active = [self.vtime.get(t, 0.0) for t in others] + [self.vtime.get(tenant_id, 0.0)]
            key = clock_key(gpu, tier)
            self.vclock[key] = max(self.vclock.get(key, 0.0), min(active))

    def served(
        self,
        tenant_id: str,
        gpus: Iterable[str],
        held: float,
        usage: Mapping[str, TenantUsage],
        waiting: Mapping[str, set[str]],
    ) -> None:
        """A turn of `held` seconds ended; `waiting` names the tenants still waiting per GPU."""
        me = usage.get(tenant_id) or _NOBODY
        mine = self.vtime[tenant_id] = self.vtime.get(tenant_id, 0.0) + held / _weight(me.duty)
        m, credit = self.config.min_share, self.config.credit_s
        for gpu in gpus:
            least, lower, higher = mine, set(), False
            for other in waiting.get(gpu, ()):
                if other == tenant_id:
                    continue
                tier = _tier(usage, other)
                if tier == me.tier:
                    least = min(least, self.vtime.get(other, 0.0))
                elif tier < me.tier:
                    lower.add(tier)
                higher = higher or tier > me.tier
            key = clock_key(gpu, me.tier)
            self.vclock[key] = max(self.vclock.get(key, 0.0), least)
            for tier in lower:
                self._add(gpu, tier, m * held, credit)
            if higher:
                self._add(gpu, me.tier, -(1 - m) * held, credit)

    def owed(self, gpu: str, tier: int) -> float:
        """GPU-seconds the tier is owed on the GPU (negative: it has had more than its minimum)."""
        return self.balance.get((gpu, tier), 0.0)

    def preempt_at(
        self, gpus: Iterable[str], tier: int, granted_at: float, waiter: Waiter, waiter_tier: int
    ) -> float | None:
        """When a holder of `tier` may be revoked for a higher-tier waiter: after the grace, and
        once the holder's tier has had the minimum share it was owed (None: never)."""
        grace = self.config.tier_grace_s
        if grace is None or waiter_tier <= tier or not set(gpus) & set(waiter.gpus):
            return None
        owed = max((self.owed(g, tier) for g in gpus), default=0.0)
        used_up = granted_at + max(0.0, owed) / max(1e-9, 1 - self.config.min_share)
        return max(waiter.enqueued_at + grace, used_up)

    def _add(self, gpu: str, tier: int, amount: float, credit: float) -> None:
        value = self.balance.get((gpu, tier), 0.0) + amount
        self.balance[(gpu, tier)] = min(credit, max(-credit, value))


def clock_key(gpu: str, tier: int) -> str:
    """Where `FairShare.vclock` keeps a GPU's virtual clock for one tier: the GPU's name for
    tier 0 (as before the tiers had clocks of their own), else the name and the tier."""
    return gpu if tier == 0 else f"{gpu} tier {tier}"


def clock_gpu(key: str) -> str:
    """The GPU of a `clock_key`."""
    return key.partition(" tier ")[0]


DEPARTED_MAX = 4096
"""Departed tenants whose debts are remembered at most (the oldest are forgotten first)."""

_NEVER = float("inf")
"""The clock of no GPU: nobody is in debt to it."""

_NOBODY = TenantUsage()
"""What the policy knows of a tenant it has no usage for (read only)."""


def _weight(duty: int) -> float:
    return max(1, duty) / 100.0


def _tier(usage: Mapping[str, TenantUsage], tenant_id: str) -> int:
    u = usage.get(tenant_id)
    return 0 if u is None else u.tier

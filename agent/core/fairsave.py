"""What of the fair policy's state (`agent.core.fair.FairShare`) survives an agent restart. Pure.

Each tenant's virtual time is kept as its lag: how far ahead of (in debt, positive) or behind
(banked credit, negative) its GPUs' clock of its tier it stands, with those GPUs and the tier;
so are the debts of departed tenants, oldest first, and what each (GPU, tier) is owed of its
minimum share. The clocks themselves are not kept: they only order tenants against each other,
so a restarted agent's clocks start at 0 and each tenant is put back at its lag behind or ahead of
them, which is all that decides who is owed what. The state file carries it (`agent.node.state`),
written with the rest of the snapshot: an agent killed between snapshots loses at most the
last snapshot interval of it, as of the GPU-time accounting.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.core.fair import FairShare, clock_key
from agent.core.leases import LeaseTable


@dataclass(frozen=True)
class Lag:
    """One tenant's virtual time against its GPUs' clock of its tier."""

    tenant_id: str
    lag: float
    """Virtual seconds ahead of the clock (it has had more than its share), or behind (< 0)."""
    tier: int
    gpus: tuple[str, ...]

    def to_json(self) -> list[Any]:
        return [self.tenant_id, self.lag, self.tier, list(self.gpus)]

    @classmethod
    def from_json(cls, data: Any) -> Lag:
        tenant_id, lag, tier, gpus = data
        return cls(str(tenant_id), float(lag), int(tier), tuple(str(g) for g in gpus))


@dataclass
class FairLags:
    """What the fair policy keeps across a restart (empty under another policy, or from a state
    file written before it was kept)."""

    tenants: list[Lag] = field(default_factory=list)
    departed: list[Lag] = field(default_factory=list)
    """Tenants that left in debt, oldest first."""
    balance: dict[tuple[str, int], float] = field(default_factory=dict)
    """What each (GPU, tier) is owed of its minimum share (`FairShare.balance`)."""

    def __bool__(self) -> bool:
        return bool(self.tenants or self.departed or self.balance)

    def to_json(self) -> dict[str, Any]:
        return {
            "tenants": [x.to_json() for x in self.tenants],
            "departed": [x.to_json() for x in self.departed],
            "balance": [[gpu, tier, owed] for (gpu, tier), owed in sorted(self.balance.items())],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FairLags:
        """Read back what `to_json` wrote (TypeError, ValueError or KeyError for another
        shape)."""
        return cls(
            tenants=[Lag.from_json(x) for x in data.get("tenants", [])],
            departed=[Lag.from_json(x) for x in data.get("departed", [])],
            balance={(str(g), int(t)): float(v) for g, t, v in data.get("balance", [])},
        )


def lags_of_table(
    table: LeaseTable, registered: Mapping[str, tuple[Sequence[str], int]]
) -> FairLags:
    """What to keep of `table`'s fair policy (empty under another policy): each `registered`
    tenant (its GPUs, its priority) measured on the GPUs it asks for, as it joins
    (`LeaseTable.fair_gpus`: registered on more, it may use fewer), in its tier."""
    if table.fair is None:
        return FairLags()
    placed = {
        tenant_id: (
            sorted(table.fair_gpus(tenant_id)) or gpus,
            table.usage[tenant_id].tier if tenant_id in table.usage else priority,
        )
        for tenant_id, (gpus, priority) in registered.items()
    }
    return lags_of(table.fair, placed)


def lags_of(fair: FairShare, placed: Mapping[str, tuple[Iterable[str], int]]) -> FairLags:
    """The policy's state to keep: the tenants `placed` names (their GPUs and tier) and the
    departed ones. A tenant with a virtual time but neither is not kept (it rejoins level)."""
    saved = FairLags(balance={k: v for k, v in fair.balance.items() if v})
    for tenant_id, (gpus, tier) in fair.departed.items():
        if tenant_id in fair.vtime:
            saved.departed.append(_lag(fair, tenant_id, gpus, tier))
    for tenant_id in fair.vtime.keys() - fair.departed.keys():
        where = placed.get(tenant_id)
        if where is not None:
            saved.tenants.append(_lag(fair, tenant_id, *where))
    saved.tenants.sort(key=lambda x: x.tenant_id)
    return saved


def restore(fair: FairShare, saved: FairLags, present: Container[str]) -> None:
    """Put each saved tenant back at its lag from its GPUs' clock as the policy has it now
    (a restarted agent's: 0), the departed in the order they left, and the balances. A saved
    tenant that is not `present` (gone since the snapshot) has left: only a debt is kept."""
    for lag in (*saved.tenants, *saved.departed):
        fair.vtime[lag.tenant_id] = _clock(fair, lag.gpus, lag.tier) + lag.lag
    for lag in saved.departed:
        fair.departed.pop(lag.tenant_id, None)
        fair.departed[lag.tenant_id] = (lag.gpus, lag.tier)
    fair.balance.update(saved.balance)
    for lag in saved.tenants:
        if lag.tenant_id not in present:
            fair.left(lag.tenant_id, lag.gpus, lag.tier)


def _lag(fair: FairShare, tenant_id: str, gpus: Iterable[str], tier: int) -> Lag:
    gpus = tuple(gpus)
    return Lag(tenant_id, fair.vtime[tenant_id] - _clock(fair, gpus, tier), tier, gpus)


def _clock(fair: FairShare, gpus: Iterable[str], tier: int) -> float:
    """The clock a tenant of `tier` on `gpus` is lifted to as it joins (`FairShare.joined`)."""
    return max((fair.vclock.get(clock_key(g, tier), 0.0) for g in gpus), default=0.0)

"""Decides which tenants' GPU memory moves before a turn: a pure function over a snapshot.

Before a tenant's turn its memory must be resident on every GPU it uses. If the residents plus
the incoming tenant fit in each GPU's memory minus the headroom, nothing moves. Otherwise the
least-recently-served residents are parked until it fits, within the node's host DRAM budget.
A tenant whose memory cgroup limit cannot hold its parked bytes, or that holds a turn right now,
is never chosen.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from baton.contract.names import MIB


class Reason(StrEnum):
    """Why a turn cannot be prepared now."""

    TOO_LARGE = "too_large"
    """The tenant alone does not fit its GPU minus the headroom."""
    HOST_BUDGET = "host_budget"
    """The parks needed would take parked bytes past the host DRAM budget."""
    CGROUP_LIMIT = "cgroup_limit"
    """Only residents whose memory limit cannot hold their parked bytes stand in the way."""
    BUSY = "busy"
    """Only residents that hold a turn right now stand in the way."""
    UNPARKABLE = "unparkable"
    """Only residents the backend cannot park (or has quarantined) stand in the way."""


@dataclass(frozen=True)
class TenantView:
    """One tenant as the planner sees it."""

    tenant_id: str
    footprint: Mapping[str, int]
    """Bytes of device memory per GPU while resident."""
    parked: Mapping[str, int] = field(default_factory=dict)
    """Bytes parked in host DRAM per GPU (GPUs absent here are resident)."""
    last_turn: float = float("-inf")
    """When its last turn was granted (any monotonic scale); older is parked first."""
    memory_limit: int | None = None
    """Its memory cgroup limit in bytes, if known; parked bytes are charged to it."""
    busy: bool = False
    """It holds a turn right now."""
    absent: frozenset[str] = frozenset()
    """GPUs where it holds no memory yet (it has not allocated since it joined)."""
    memory_used: int = 0
    """Bytes its memory cgroup uses already; parked bytes come on top."""
    unparkable: str = ""
    """Why the backend cannot park it (it stays resident); empty if it can."""
    method: str = ""
    """How it parks (`cuda`, `app`, `fake`, ...); its steps carry it to the method's backend."""

    @property
    def parked_total(self) -> int:
        """Bytes it has parked in host DRAM."""
        return sum(self.parked.values())

    def resident_on(self, gpu: str) -> int:
        """Bytes it occupies on `gpu` now."""
        return 0 if gpu in self.parked or gpu in self.absent else self.footprint.get(gpu, 0)

    def cgroup_blocks_park(self) -> bool:
        """Parking would charge more bytes to its memory cgroup than its limit allows."""
        return self.memory_limit is not None and self.memory_limit < self.memory_used + sum(
            self.footprint.values()
        )

    def cgroup_message(self) -> str:
        """Why its memory cgroup cannot hold its parked bytes, with the numbers."""
        return (
            f"its memory limit {_mib(self.memory_limit or 0)} cannot hold its "
            f"{_mib(sum(self.footprint.values()))} of GPU memory on top of the "
            f"{_mib(self.memory_used)} it uses"
        )


@dataclass(frozen=True)
class NodeView:
    """The node as it is now: GPU memory, headroom, host budget and every tenant."""

    gpu_memory: Mapping[str, int]
    tenants: Mapping[str, TenantView]
    headroom: int = 0
    host_budget: int = 0
    promised: int = 0
    """Host DRAM that holders told to park as they yield will take (not parked yet): the
    budget holds it for them."""

    @property
    def parked_bytes(self) -> int:
        """Bytes parked in host DRAM across the node."""
        return sum(t.parked_total for t in self.tenants.values())

    @property
    def taken(self) -> int:
        """Host DRAM taken: what is parked and what is `promised`."""
        return self.parked_bytes + self.promised

    def already(self) -> str:
        """What `taken` holds, for a refusal that names the budget."""
        said = f"{_mib(self.parked_bytes)} parked already"
        if self.promised:
            said += f", {_mib(self.promised)} to be parked by holders as they yield"
        return said


@dataclass(frozen=True)
class Step:
    """One move: park or restore one tenant on one GPU."""

    direction: str  # "park" | "restore"
    tenant_id: str
    gpu: str
    bytes: int
    method: str = ""
    """The tenant's parking method, as its `TenantView` names it."""


@dataclass(frozen=True)
class Plan:
    """Ordered moves: parks first (they make the room), then the incoming tenant's restores."""

    steps: tuple[Step, ...] = ()

    @property
    def parks(self) -> tuple[Step, ...]:
        """The park steps."""
        return tuple(s for s in self.steps if s.direction == "park")


@dataclass(frozen=True)
class Refusal:
    """The turn cannot be prepared now; `message` names the numbers."""

    reason: Reason
    message: str
    tenant_id: str = ""
    """The resident that stands in the way, if one does."""


def _mib(n: int) -> str:
    return f"{n / MIB:.0f} MiB"


def too_large(me: TenantView, gpu_memory: Mapping[str, int], headroom: int) -> Refusal | None:
    """The refusal of every turn of `me`, if it needs more on one of its GPUs than the GPU
    holds after the headroom (no move can ever make that room)."""
    for gpu in sorted(me.footprint):
        capacity = gpu_memory.get(gpu, 0) - headroom
        if me.footprint[gpu] > capacity:
            return Refusal(
                Reason.TOO_LARGE,
                f"{me.tenant_id} needs {_mib(me.footprint[gpu])} on {gpu}, which holds "
                f"{_mib(capacity)} after {_mib(headroom)} headroom",
                me.tenant_id,
            )
    return None


def plan_turn(snap: NodeView, incoming: str) -> Plan | Refusal:
    """Plan the moves that make `incoming` resident on every GPU it uses."""
    me = snap.tenants[incoming]
    if (refusal := too_large(me, snap.gpu_memory, snap.headroom)) is not None:
        return refusal
    victims: list[TenantView] = []
    for gpu in sorted(me.footprint):
        found = _make_room(snap, me, gpu, victims)
        if isinstance(found, Refusal):
            return found
        victims.extend(found)
    parking = sum(sum(v.resident_on(g) for g in v.footprint) for v in victims)
    if victims and snap.taken + parking > snap.host_budget:
        return Refusal(
            Reason.HOST_BUDGET,
            f"parking {', '.join(v.tenant_id for v in victims)} ({_mib(parking)}) for "
            f"{incoming} would put {_mib(snap.taken + parking)} in host memory, over "
            f"the {_mib(snap.host_budget)} budget ({snap.already()})",
            victims[0].tenant_id,
        )
    steps = [
        Step("park", v.tenant_id, g, v.footprint[g], v.method)
        for v in victims
        for g in sorted(v.footprint)
        if v.resident_on(g)
    ]
    steps += [Step("restore", incoming, g, n, me.method) for g, n in sorted(me.parked.items())]
    return Plan(tuple(steps))


def _make_room(
    snap: NodeView, me: TenantView, gpu: str, chosen: list[TenantView]
) -> list[TenantView] | Refusal:
    """Least-recently-served residents to park on `gpu` (beyond `chosen`), or why none will do."""
    capacity = snap.gpu_memory[gpu] - snap.headroom
    gone = {me.tenant_id} | {t.tenant_id for t in chosen}
    others = [t for t in snap.tenants.values() if t.tenant_id not in gone and t.resident_on(gpu)]
    used = sum(t.resident_on(gpu) for t in others)
    need = me.footprint[gpu]
    picked: list[TenantView] = []
    skipped: list[TenantView] = []
    for t in sorted(others, key=lambda t: (t.last_turn, t.tenant_id)):
        if used + need <= capacity:
            break
        if t.busy or t.cgroup_blocks_park() or t.unparkable:
            skipped.append(t)
            continue
        picked.append(t)
        used -= t.resident_on(gpu)
    if used + need <= capacity:
        return picked
    return _blocked(me.tenant_id, gpu, need, capacity - used, skipped)


def _blocked(incoming: str, gpu: str, need: int, free: int, skipped: list[TenantView]) -> Refusal:
    """The refusal when only unparkable residents stand in the way."""
    pinned = [t for t in skipped if t.unparkable and not t.busy]
    if pinned:
        t = pinned[0]
        return Refusal(
            Reason.UNPARKABLE,
            f"{incoming} needs {_mib(need)} on {gpu} ({_mib(free)} free); {t.tenant_id} "
            f"stays resident: {t.unparkable}",
            t.tenant_id,
        )
    by_cgroup = [t for t in skipped if not t.busy]
    if by_cgroup:
        t = by_cgroup[0]
        return Refusal(
            Reason.CGROUP_LIMIT,
            f"{incoming} needs {_mib(need)} on {gpu} ({_mib(free)} free); {t.tenant_id} "
            f"stays resident: {t.cgroup_message()}",
            t.tenant_id,
        )
    t = skipped[0]
    return Refusal(
        Reason.BUSY,
        f"{incoming} needs {_mib(need)} on {gpu} ({_mib(free)} free); {t.tenant_id} holds a "
        f"turn and stays resident until it yields",
        t.tenant_id,
    )


def plan_park(snap: NodeView, tenant_id: str) -> Plan | Refusal:
    """Plan parking `tenant_id` on every GPU it is resident on (a preempted holder)."""
    t = snap.tenants[tenant_id]
    size = sum(t.resident_on(g) for g in t.footprint)
    if not size:
        return Plan()
    if t.unparkable:
        return Refusal(Reason.UNPARKABLE, f"{tenant_id} stays resident: {t.unparkable}", tenant_id)
    if t.cgroup_blocks_park():
        return Refusal(
            Reason.CGROUP_LIMIT, f"{tenant_id} stays resident: {t.cgroup_message()}", tenant_id
        )
    if snap.taken + size > snap.host_budget:
        return Refusal(
            Reason.HOST_BUDGET,
            f"parking {tenant_id} ({_mib(size)}) would put {_mib(snap.taken + size)} in "
            f"host memory, over the {_mib(snap.host_budget)} budget"
            + (f" ({snap.already()})" if snap.promised else ""),
            tenant_id,
        )
    return Plan(
        tuple(
            Step("park", tenant_id, g, n, t.method)
            for g, n in sorted(t.footprint.items())
            if t.resident_on(g)
        )
    )


def plan_ahead(snap: NodeView, incoming: str) -> Plan | Refusal:
    """Plan making `incoming`, due next, resident while the current holders run.

    Like `plan_turn`, but holders count with their whole footprint (they may still allocate
    during their turn), and neither they nor `incoming` is ever parked.
    """
    holders = {
        t.tenant_id: replace(t, absent=frozenset())
        for t in snap.tenants.values()
        if t.busy and t.tenant_id != incoming
    }
    if incoming not in snap.tenants or snap.tenants[incoming].busy:
        return Plan()
    return plan_turn(replace(snap, tenants={**snap.tenants, **holders}), incoming)

"""What the agent knows of each tenant's memory: the truth a grant that moves nothing plans on.

Memory moves only through the preparer, one plan at a time, which reads the tenants it moved
after its moves, so where each tenant's memory is (resident or parked) is known without asking
the backend. What changes without the agent is how much a tenant holds: it allocates while it
runs, in its turns. So a tenant that held a turn since the model last read it is *unsettled*,
and plans count it with its whole footprint (what it declared, or what was last read),
allocated or not. How much it may have grown has a bound only if it declared its memory; one
that declared nothing, or has been found holding more than it declared, is *unbounded*, and a
grant that needs room beside it reads the node first. After a grant made on the model's word,
the unsettled tenants that no longer hold a turn are read again off the grant's path
(`ParkingPreparer` runs it); `settle` takes that read in, and names what the model had wrong.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from agent.core.planner import TenantView
from agent.parking.backends.base import TenantState

Cgroup = tuple[int | None, int]
"""A tenant's memory cgroup limit (if known) and what it uses, in bytes."""


@dataclass
class Read:
    """Some tenants as the backend reported them, and the model's generation when asked."""

    states: dict[str, TenantState]
    cgroups: dict[str, Cgroup]
    generation: int


@dataclass
class ResidencyModel:
    """Every tenant's last read state, which of them may have grown since, and which outgrew
    what they declared."""

    states: dict[str, TenantState] = field(default_factory=dict)
    cgroups: dict[str, Cgroup] = field(default_factory=dict)
    unsettled: set[str] = field(default_factory=set)
    """Tenants that held a turn since they were last read: they may hold more now."""
    outgrew: set[str] = field(default_factory=set)
    """Tenants found holding more than they declared: their declaration bounds nothing."""
    generation: int = 0
    """Counts full reads; a read begun before one is stale."""
    revision: int = 0
    """Counts changes to what was read (states, cgroups, outgrew): a verdict drawn from the
    model holds while it and `unsettled` are as they were."""

    def replace_all(self, read: Read, holding: Collection[str]) -> None:
        """A full read (after moves, or before a plan): only tenants holding a turn stay
        unsettled."""
        self.generation += 1
        self.revision += 1
        self.states = read.states
        self.cgroups = read.cgroups
        self.unsettled = {t for t in self.unsettled if t in holding and t in self.states}
        self.outgrew &= self.states.keys()

    def moved(self, read: Read, holding: Collection[str], counted: Collection[str]) -> None:
        """A read of the tenants a plan just moved, taken after its moves (under the
        preparer's lock, held since the plan was drawn): their states replace the model's,
        tenants no longer `counted` leave it, and every other tenant stays as the model had it
        when the plan was drawn, since nothing but those moves ran meanwhile. Reads begun before
        it are dropped (`settle`), as after a full read."""
        self.generation += 1
        self.revision += 1
        for tenant_id in [t for t in self.states if t not in counted]:
            self.states.pop(tenant_id)
            self.cgroups.pop(tenant_id, None)
            self.unsettled.discard(tenant_id)
            self.outgrew.discard(tenant_id)
        for tenant_id, st in read.states.items():
            if tenant_id not in self.states:  # gone meanwhile
                continue
            self.states[tenant_id] = st
            self.cgroups[tenant_id] = read.cgroups[tenant_id]
            if tenant_id not in holding:
                self.unsettled.discard(tenant_id)

    def granted(self, tenant_id: str) -> None:
        """The tenant's turn starts: it may allocate from now on."""
        self.unsettled.add(tenant_id)

    def settle(self, read: Read, holding: Collection[str]) -> list[str]:
        """Take in a read of some tenants made while nothing moved; what the model had wrong.

        A read begun before the last full read is dropped: that one is newer.
        """
        if read.generation != self.generation:
            return []
        wrong = []
        for tenant_id, st in read.states.items():
            if tenant_id not in self.states:  # gone meanwhile
                continue
            before = self.states[tenant_id]
            if st != before or read.cgroups[tenant_id] != self.cgroups.get(tenant_id):
                self.revision += 1
            if _moved(before, st):
                wrong.append(
                    f"the backend has {tenant_id} {_where(st)}, where the agent had it "
                    f"{_where(before)}; planning from the backend's word"
                )
            self.states[tenant_id] = st
            self.cgroups[tenant_id] = read.cgroups[tenant_id]
            if tenant_id not in holding:
                self.unsettled.discard(tenant_id)
        return wrong

    def note_outgrown(self, tenant_id: str) -> None:
        """The tenant holds more than it declared: count it as unbounded from now on."""
        self.outgrew.add(tenant_id)
        self.revision += 1

    def forget(self, tenant_id: str) -> None:
        """The tenant is gone."""
        self.revision += 1
        self.states.pop(tenant_id, None)
        self.cgroups.pop(tenant_id, None)
        self.unsettled.discard(tenant_id)
        self.outgrew.discard(tenant_id)


def _moved(before: TenantState, now: TenantState) -> bool:
    """Whether memory went on or off a GPU between two reads (a first allocation, or memory
    freed, is not a move)."""
    return any(
        g in now.residency and now.residency[g] != where for g, where in before.residency.items()
    )


def _where(st: TenantState) -> str:
    return ", ".join(f"{r.value} on {g}" for g, r in sorted(st.residency.items())) or "nowhere"


def needs_room(me: TenantView, held: Mapping[str, int]) -> bool:
    """Whether the tenant must be given room it does not occupy yet on one of its GPUs.

    `held`: the bytes it was last read holding per GPU. A tenant that holds its whole footprint
    needs none: its memory is on the device, and nothing but a park (the agent's own) takes it.
    """
    return any(n > held.get(g, 0) for g, n in me.footprint.items() if g not in me.parked)

"""What the preparer decides from its model of the node, without reading every tenant first.

Whether a grant moves nothing is decided from the residency model (`agent.parking.model`) alone,
where the model can say (it has read every tenant as registered now, and no tenant whose growth
has no bound stands beside one that needs room); a grant that must move memory is planned from
it where it can say too, so it waits for the moves alone; after any plan's moves only the
tenants it moved are read again (what the model holds and how it is read: `agent.parking.known`).
A preparation ahead whose plan over the model is a refusal reads nothing. Where the model cannot
say, the preparer reads the node in full first (`agent.parking.preparer`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from agent.core.planner import Plan, Refusal, plan_ahead, plan_turn
from agent.parking.backends.base import TenantRef
from agent.parking.known import KnownNode
from agent.parking.methods import parks_itself
from agent.parking.model import Read, needs_room
from agent.parking.view import away

MAX_VERDICTS = 64
"""Plans over the model (`_model_plan`) kept at once (a few per tenant); more, and they start
afresh."""


class ModelPlans(KnownNode):
    """The verdicts, plans and reads drawn from the model; `ParkingPreparer` carries them out."""

    def _moves_nothing(
        self, tenant_id: str, gpus: Collection[str], holders: Collection[str] | None = None
    ) -> bool:
        """The model shows the tenant resident with room (beside `holders` if ahead of its
        turn): its grant moves nothing, and needs no read of the node to know it."""
        planned = self._model_plan(tenant_id, gpus, holders)
        return isinstance(planned, Plan) and not planned.steps

    def _no_room_ahead(self, tenant_id: str, gpus: Sequence[str], holders: Collection[str]) -> bool:
        """The model shows that no room can be made for the tenant while `holders` run (their
        memory stands in the way, counted whole): no read is worth taking then. A model that is
        wrong costs only this preparation, which the grant then makes itself."""
        return isinstance(self._model_plan(tenant_id, gpus, holders), Refusal)

    def _model_plan(
        self, tenant_id: str, gpus: Collection[str], holders: Collection[str] | None = None
    ) -> Plan | Refusal | None:
        """The plan over the model for the tenant's turn (ahead of it while `holders` run),
        kept while nothing it is drawn from changes: `_moves_nothing` and `_no_room_ahead` ask
        for the same one. None where the model cannot say: a plan runs or is on the way for
        it, the tenants changed since the last read, it needs room beside a tenant whose growth
        has no bound; or where a grant must restore it (planned under the lock instead)."""
        ref = self._model_ref(tenant_id, gpus)
        if ref is None:
            return None
        at = (self._model.revision, self._revision)
        if at != self._verdicts_at or len(self._verdicts) > MAX_VERDICTS:
            self._verdicts.clear()
            self._verdicts_at = at
        key = (
            tenant_id,
            frozenset(gpus),
            None if holders is None else frozenset(holders),
            frozenset(self._holding),
            frozenset(self._model.unsettled),
        )
        if key not in self._verdicts:
            self._verdicts[key] = self._plan_over_model(tenant_id, ref, holders)
        return self._verdicts[key]

    def _plan_over_model(
        self, tenant_id: str, ref: TenantRef, holders: Collection[str] | None
    ) -> Plan | Refusal | None:
        """`_model_plan`'s plan, drawn only from the model's reads and unsettled tenants, the
        tenants registered here and their methods, who holds a turn, and `holders`:
        `_model_plan` keeps it while none of those changes."""
        if holders is None and away(self._model.states[tenant_id]):  # no need to draw the node
            return None
        snap = self._node(holders or (), whole=self._model.unsettled, on=ref.gpus)
        me = snap.tenants.get(tenant_id)
        if me is None:
            return None
        held = self._model.states[tenant_id].footprint_bytes
        if needs_room(me, held) and self._unbounded_beside(tenant_id, me.footprint):
            return None
        return plan_turn(snap, tenant_id) if holders is None else plan_ahead(snap, tenant_id)

    def _model_ref(self, tenant_id: str, gpus: Collection[str]) -> TenantRef | None:
        """`_current_ref`, where no plan runs or is on the way for the tenant: the model can
        plan its turn on `gpus` alone; None otherwise (also for a tenant being forgotten: as
        the lock passes to its `forget`, it is unlocked for a step)."""
        if self._lock.locked() or tenant_id in self._ahead or tenant_id in self._forgetting:
            return None
        return self._current_ref(tenant_id, gpus)

    def _current_ref(self, tenant_id: str, gpus: Collection[str]) -> TenantRef | None:
        """The tenant as registered, if it is not quarantined, `gpus` are its own and the model
        has read every tenant as registered now (also under the preparer's lock); else None."""
        ref = self._refs.get(tenant_id)
        if tenant_id in self.quarantines.why or ref is None or not set(gpus) <= set(ref.gpus):
            return None
        return ref if self._model_current() else None

    def _model_current(self) -> bool:
        """Whether the model has read every tenant that counts, as it is registered now."""
        if self._host is None:
            return self._refs.keys() <= self._model.states.keys()
        refs = self._host.tenant_refs()
        now = (self._model.revision, self._revision)
        if self._current_for == (refs, now):
            return True  # the same tenants (the same dict, while unchanged) and the same reads
        if refs.keys() != self._model.states.keys():
            return False
        if not all(self._refs.get(t) == ref for t, ref in refs.items()):
            return False
        self._current_for = (refs, now)
        return True

    def _unbounded_beside(self, tenant_id: str, gpus: Collection[str]) -> bool:
        """An unsettled tenant on `gpus` may have grown by any amount since it was read."""
        for other in self._model.unsettled:
            ref = self._refs.get(other)
            if other == tenant_id or ref is None or not set(ref.gpus) & set(gpus):
                continue
            bounded = bool(ref.declared_bytes) or (
                ref.self_parks and parks_itself(self.backend.method_of(other))
            )
            if not bounded or other in self._model.outgrew:
                return True
        return False

    def _moves_from_model(self, tenant_id: str, gpus: Collection[str]) -> Plan | None:
        """Under the lock: the plan for the tenant's turn drawn from the model, where the model
        can say (as for a grant that moves nothing: it has read every tenant as registered now,
        and no tenant whose growth has no bound stands beside one that needs room), the plan
        makes the room, it parks nobody into a memory cgroup (whose use the model has only
        as last read), and its parks stay within the host budget whatever the tenants whose
        turns ended hold now; None otherwise (a refusal is the backend's to confirm)."""
        if self._current_ref(tenant_id, gpus) is None:
            return None
        snap = self._node((), whole=self._model.unsettled)
        me = snap.tenants.get(tenant_id)
        if me is None:
            return None
        held = self._model.states[tenant_id].footprint_bytes
        room = bool(me.parked) or needs_room(me, held)  # a restore needs room too
        if room and self._unbounded_beside(tenant_id, me.footprint):
            return None
        plan = plan_turn(snap, tenant_id)
        if not isinstance(plan, Plan):
            return None
        for step in plan.parks:  # parked bytes are charged to a memory cgroup as it is now
            if self._model.cgroups.get(step.tenant_id, (None, 0))[0] is not None:
                return None
        if self._may_pass_budget(snap.taken, plan):
            return None
        return plan

    def _may_pass_budget(self, parked: int, plan: Plan) -> bool:
        """Whether the plan's parks may take the bytes parked (`parked` now, with those
        promised by holders that park as they yield) past the host budget: a tenant whose turn
        ended since it was read is planned with what it declared, but a park moves what it
        holds, which may be up to its whole GPU (the backend's read tells; a refusal then names
        the budget). A plan that parks nobody adds nothing, whatever is parked already."""
        if not plan.parks:
            return False
        worst = parked
        for step in plan.parks:
            grew = step.tenant_id in self._model.unsettled
            worst += max(step.bytes, self.gpu_memory.get(step.gpu, 0) if grew else 0)
        return worst > self.host_budget

    def _own_restores(self, tenant_id: str, gpus: Collection[str]) -> Plan | None:
        """The model's plan for the tenant's turn when it is nothing but restores of its own
        memory by its own process (which a grant may leave to it, `hand_restore`); None when it
        is anything else, or when the model cannot say (as for `_moves_nothing`)."""
        ref = self._model_ref(tenant_id, gpus)
        if ref is None or not self.backend.parks_itself(tenant_id):
            return None
        ended = [t for t, held in self._holding.items() if held & set(gpus)]  # granted over them
        snap = self._node((), whole=self._model.unsettled, on=ref.gpus, ended=ended)
        me = snap.tenants.get(tenant_id)
        if me is None or not me.parked or self._unbounded_beside(tenant_id, me.footprint):
            return None
        plan = plan_turn(snap, tenant_id)
        if not isinstance(plan, Plan) or not plan.steps:
            return None
        mine = all(s.tenant_id == tenant_id and s.direction == "restore" for s in plan.steps)
        return plan if mine else None

    async def _read_moved(self, tenant_ids: Collection[str], read: Read | None = None) -> None:
        """Read the tenants a plan moved (in a worker thread if the backend's reads block), or
        take in their `read` made after the moves. One plan runs at a time, so only their
        memory moved since the plan was drawn; the others stay as the model had them then
        (`model.ResidencyModel.moved`). A tenant that joined or whose registration changed
        meanwhile is not taken in here: the model is then not current (`_model_current`), and
        the next plan reads the node in full."""
        counted = self._counted()
        if read is None:
            read = await self._read_aside(sorted(t for t in set(tenant_ids) if t in counted))
        self._model.moved(read, self._holding.keys(), counted)
        self._took_in(read)

    def _counted(self) -> set[str]:
        """The tenants that count now (`_tenant_ids`' without registering any)."""
        if self._host is None:
            return set(self._refs) | set(self._model.states)
        return set(self._host.tenant_refs())


def moved_steps(plan: Plan) -> set[tuple[str, str, str]]:
    """What a plan moves, and where: (direction, tenant, GPU) of each step."""
    return {(step.direction, step.tenant_id, step.gpu) for step in plan.steps}

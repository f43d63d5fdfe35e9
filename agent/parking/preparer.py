"""The real `TurnPreparer`: plans room for each turn and runs the moves through a backend.

Plans come from `agent.core.planner` (pure); this module gathers the snapshot and has the plans
carried out (`agent.parking.moving`: off the event loop, failed moves retried with backoff), and
keeps the per tenant status that /v1/status shows. One plan runs at a time per node. While a GPU
is held, `prepare_ahead` readies the tenant due next (`agent.core.planner.plan_ahead`), so that
its grant finds nothing left to move. A turn the agent's own model (`agent.parking.from_model`)
shows needs no move is granted from it at once, on the event loop: no snapshot, no thread, no
lock. One that needs moves is planned from the same model where it can say, so the grant waits
for the moves alone; the backend is read first where it cannot, and where the model finds no
room.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace

from agent.core.planner import Plan, TenantView, plan_ahead, plan_park, plan_turn, too_large
from agent.core.residency import NoRoom
from agent.parking.backends.base import Backend, BackendError, TenantRef
from agent.parking.from_model import moved_steps
from agent.parking.known import counted
from agent.parking.moving import PlanMoves
from agent.parking.view import gpu_residency

log = logging.getLogger(__name__)


class ParkingPreparer(PlanMoves):
    """Makes each incoming tenant resident, parking least-recently-served ones when needed; the
    server sees it as an `agent.parking.host.Parking`."""

    def methods(self) -> tuple[str, ...]:
        """The node's parking methods, its default first."""
        return self.backend.methods()

    def method_of(self, tenant_id: str) -> str:
        """The method that moves the tenant's memory (or would)."""
        return self.backend.method_of(tenant_id)

    def method_for(self, ref: TenantRef) -> str:
        """The method that moves the tenant `ref` describes, attached or not (for events)."""
        return self.backend.method_for(ref)

    def residency_of(self, tenant_id: str) -> dict[str, str]:
        """One tenant's `status()["tenants"][id]["gpus"]`, from the model alone."""
        st = self._model.states.get(tenant_id)
        return {} if st is None else gpu_residency(st)

    def parked_by_tenant(self) -> dict[str, int]:
        """Bytes each tenant has parked in host DRAM, from the model alone."""
        return {t: st.parked_bytes for t, st in self._model.states.items() if st.parked_bytes}

    def backend_for(self, method: str) -> Backend:
        """The backend that moves tenants by `method`, one of `methods()`."""
        return self.backend.backend_for(method)

    async def pin(self, tenant_id: str, method: str) -> None:
        """Move the tenant by `method` until it is resident again (llm-d's BackendConfig).
        Under the lock, as every move: no grant parks or restores it by its old method between
        the check that nothing of it is parked and the pin, and `forget` runs before or after
        (a tenant gone by then is refused: nothing is kept for it). It reads the tenant's state
        in a worker thread."""
        async with self._lock:
            if self._host is not None and tenant_id not in self._host.tenant_refs():
                raise BackendError(f"{tenant_id} left the node: there is nothing to move")
            await asyncio.to_thread(self.backend.pin, tenant_id, method)
            self._revision += 1

    async def prepare(self, tenant_id: str, gpus: Sequence[str], handed: bool = False) -> None:
        """Make `tenant_id` resident on its GPUs; raise `NoRoom` naming the numbers if not now.
        `handed`: its own restores are left to it where its method allows (`hand_restore`)."""
        asleep = self.backend.asleep_on(gpus)  # an engine there may be awake again: ask it
        if not asleep and self._moves_nothing(tenant_id, gpus):  # from the model, at once
            self._take_turn(tenant_id, gpus)
            self._settle_soon()
            return
        if handed and not asleep and self._hand_from_model(tenant_id, gpus):  # left to it
            return
        ahead = self._ahead.get(tenant_id)
        if ahead is not None:  # its memory is on the way already: wait for that, move nothing
            await asyncio.wait({ahead})
        async with self._lock:
            self._check_counted(tenant_id)  # it may have left while it waited for the lock
            if tenant_id not in self._refs:
                self.register(TenantRef(tenant_id, tuple(gpus)))
            await self._awake_again(gpus)
            self._granted_over(gpus)
            planned = self._moves_from_model(tenant_id, gpus)
            failed: NoRoom | None = None
            if planned is not None:
                try:
                    await self._carry_out(tenant_id, planned, "grant", handed)
                except NoRoom as e:  # moves on the model's word failed: the backend decides
                    failed = e
                self._check_counted(tenant_id)  # or during those moves
            if planned is None or failed is not None:  # the model cannot say, says no, or erred
                snap = await self._reread()
                if tenant_id in self.quarantines.why:
                    raise self._refuse_quarantined(tenant_id)
                self._check_counted(tenant_id)
                plan = plan_turn(snap, tenant_id)
                if failed is not None and planned is not None:
                    if isinstance(plan, Plan) and moved_steps(plan) <= moved_steps(planned):
                        raise failed  # the node as read asks for the same moves: they fail
                    log.warning("%s; planning %s's turn from the node as read", failed, tenant_id)
                await self._carry_out(tenant_id, plan, "grant", handed)
                self._check_counted(tenant_id)
            self._take_turn(tenant_id, gpus)
            self._settle_soon()  # the tenants whose turns ended, read in the new turn

    def _check_counted(self, tenant_id: str) -> None:
        """Raise `NoRoom` if the tenant whose turn is being prepared left meanwhile (the host no
        longer counts it: its last session ended, and `forget` follows or has run): nothing more
        is moved for it, it is not registered again nor counted holding a turn, and the
        moves made so far stand as read after them. Its waiter has left the queue with it."""
        if self._host is None or tenant_id in self._host.tenant_refs():
            return
        log.info("%s left while its turn was being prepared: no room is made for it", tenant_id)
        raise NoRoom(f"{tenant_id} left before its turn was ready")

    async def _awake_again(self, gpus: Collection[str]) -> None:
        """Under the lock, before a plan that places memory on `gpus`: ask each tenant counted
        parked there whose memory may be back without the agent (an engine restarted awake:
        `asleep_on`) whether it is; one that is is read again, resident, so that the plan
        parks it before another tenant's memory goes where its memory is."""
        for other in self.backend.asleep_on(gpus):
            if not await asyncio.to_thread(self.backend.awake_again, other):
                continue
            if other in self._model.states:
                read = await self._read_aside([other])
                for wrong in self._model.settle(read, self._holding.keys()):
                    log.warning("%s (its engine is awake: restarted?)", wrong)
                self._took_in(read)
            if self._host is not None:
                self._host.persist()

    def _hand_from_model(self, tenant_id: str, gpus: Sequence[str]) -> bool:
        """Grant from the model when the turn needs nothing but the tenant's own restores, and
        leave them to it (`hand_restore`): no snapshot, no lock (as a grant that moves
        nothing). Whether it was granted so."""
        plan = self._own_restores(tenant_id, gpus)
        if plan is None:
            return False
        for step in plan.steps:
            if not self._hand_over(tenant_id, step):
                return False  # the method restores it itself after all: the full path does
            log.info("restore of %s on %s is left to its grant", tenant_id, step.gpu)
        self._read_now(tenant_id)
        if self._host is not None:
            self._host.persist()
        self._take_turn(tenant_id, gpus)
        self._settle_soon()
        return True

    async def prepare_ahead(
        self, tenant_id: str, gpus: Sequence[str], holders: Collection[str] = ()
    ) -> None:
        """Make the tenant due next resident while `holders` run; best effort, raises nothing."""
        if tenant_id in self._ahead or self._moves_nothing(tenant_id, gpus, holders):
            return
        if self._no_room_ahead(tenant_id, gpus, holders):
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ahead[tenant_id] = done
        try:
            async with self._lock:
                await self._awake_again(gpus)
                snap = await self._reread(holders)
                if tenant_id in self.quarantines.why:
                    return
                plan = plan_ahead(snap, tenant_id)
                if isinstance(plan, Plan) and plan.steps:
                    log.info("preparing %s ahead of its turn", tenant_id)
                    await self._carry_out(tenant_id, plan, "ahead")
        except Exception as e:  # the grant will make room itself, and say why if it cannot
            log.warning("preparing %s ahead of its turn stopped: %s", tenant_id, e)
        finally:
            del self._ahead[tenant_id]
            done.set_result(None)

    def never_fits(self, tenant_id: str) -> NoRoom | None:
        """`TooLarge` if the tenant declared more memory than one of its GPUs holds after the
        headroom (its turn's plan would find so whenever it is made), counted and shown as that
        refusal; None otherwise. Asked as the tenant asks, before it waits for a holder."""
        refs = self._host.tenant_refs() if self._host is not None else self._refs
        ref = refs.get(tenant_id)
        if ref is None or not ref.declared_bytes:
            return None
        known = [g for g in ref.gpus if g in self.gpu_memory]
        me = TenantView(tenant_id, footprint=dict.fromkeys(known, ref.declared_bytes))
        refusal = too_large(me, self.gpu_memory, self.headroom)
        return None if refusal is None else self._refuse(tenant_id, refusal.reason, refusal.message)

    def not_restored(self, tenant_id: str, parked: Mapping[str, int]) -> None:
        """The tenant's process ends its turn with this memory still parked (GPU → bytes, as
        its client counts them): the backend counts it parked again, as its last park left it,
        and the model reads the tenant now (the backend keeps that record in memory: no wait)."""
        ref = self._refs.get(tenant_id)
        gpus = [g for g in parked if ref is not None and g in ref.gpus]
        for gpu in gpus:
            self.backend.not_restored(tenant_id, gpu)
        if gpus:
            self._read_now(tenant_id)
            held = ", ".join(f"{parked[g]} bytes on {g}" for g in gpus)
            log.info("%s still holds %s parked after its turn", tenant_id, held)

    def parks_at_yield(
        self, holder: str, incoming: str, gpus: Collection[str], reserved: int = 0
    ) -> dict[str, int]:
        """GPU → bytes: what `incoming`'s turn, granted once `holder` yields, would park of
        `holder` (the model's plan over the whole node, no I/O), where `holder`'s own process
        moves its memory and the host budget holds it beside what is parked and what other
        holders were told to park (`reserved`, or as `told_to_park` kept it if more); empty
        when not, or when the model cannot say."""
        if self._lock.locked() or not self.backend.parks_itself(holder):
            return {}
        if incoming not in self._refs or holder not in self._model.states:
            return {}
        if not self._model_current():
            return {}
        snap = self._node((), whole=self._model.unsettled, ended=(holder,))
        others = max(reserved, self._promises(besides=holder))
        snap = replace(snap, promised=others)
        if incoming not in snap.tenants:
            return {}
        plan = plan_turn(snap, incoming)
        if not isinstance(plan, Plan):
            return {}
        if snap.taken + sum(s.bytes for s in plan.parks) > self.host_budget:
            return {}
        return {s.gpu: s.bytes for s in plan.parks if s.tenant_id == holder}

    def told_to_park(self, holder: str, gpus: Collection[str], parked: Mapping[str, int]) -> None:
        """The holder of the turn on `gpus` was told to park `parked` (GPU → bytes, from
        `parks_at_yield`; empty: nothing, now) as it yields: the host budget holds them for it
        (other grants plan beside them) until its turn there ends, even once the hint is
        withdrawn (the holder may yield with its park before it hears so)."""
        mine = {g: n for g, n in parked.items() if g in gpus}
        promised = self._promised.setdefault(holder, {})
        if mine and any(promised.get(g) != n for g, n in mine.items()):
            promised.update(mine)  # (a withdrawal may cross its yield: what it was told stays)
            self._revision += 1  # plans kept over the model counted the budget without it
        if not promised:
            del self._promised[holder]

    def parked_at_yield(self, tenant_id: str, parked: Mapping[str, int]) -> None:
        """The tenant's process parked this memory itself as its turn ended (GPU → bytes its
        park moved; `parks_at_yield`): counted parked now, so that the next grant moves none."""
        ref = self._refs.get(tenant_id)
        moved = False
        for gpu, size in sorted(parked.items()):
            if ref is None or gpu not in ref.gpus or size < 0:
                continue
            move = self.backend.self_parked(tenant_id, gpu, size)
            if move is not None:
                self.metrics.moved(move, "yielded", self.backend.method_of(tenant_id), timed=False)
                moved = True
        if moved:
            self.released(tenant_id, parked)  # its turn is ending: nothing to make room for
            self._read_now(tenant_id)
            if self._host is not None:
                self._host.persist()
            over = self._parked_bytes() - self.host_budget
            if over > 0:  # its own memory, moved already: counted as it is, and said
                log.warning("%s parked itself %d bytes past the host budget", tenant_id, over)

    def _read_now(self, tenant_id: str) -> None:
        """Read one tenant into the model now (a backend whose record is in memory)."""
        if tenant_id in self._model.states:
            read = self._read([tenant_id], self._model.generation)
            self._model.settle(read, self._holding.keys())  # the tenant said so: no warning
            self._took_in(read)

    async def settled(self) -> None:
        """Return once the moves (ahead ones included) and reads started before this call are
        done."""
        if self._ahead:
            await asyncio.wait(list(self._ahead.values()))
        async with self._lock:
            pass
        while self._settling is not None:
            await asyncio.wait({self._settling})
        self._settle_now(self._model.unsettled)
        if self._settling is not None:
            await asyncio.wait({self._settling})

    async def refresh(self) -> None:
        """Read every tenant from the backend now (the model is otherwise read when it must be)."""
        async with self._lock:
            await self._reread()

    async def revoke(
        self,
        tenant_id: str,
        gpus: Sequence[str],
        holds: Callable[[], bool] = lambda: True,
        waited: Callable[[], bool] = lambda: True,
    ) -> bool:
        """Park a holder whose lease ran out while others wait; `NoRoom` (it keeps its turn)
        if it must stay. Under the lock, before anything moves, the revocation must still stand:
        its lease still `holds`, and someone still `waited` for its GPUs; if not (it yielded
        while the revocation waited for the node or read it, its waiters left), nothing is
        parked and False is returned."""
        async with self._lock:
            if not (holds() and waited()):
                return False
            held, promised = self._holding.get(tenant_id), self._promised.get(tenant_id)
            self.released(tenant_id, gpus)
            went = False
            try:
                snap = await self._reread()
                if holds() and waited():  # or it yielded, or its waiters left, meanwhile
                    if tenant_id in snap.tenants:
                        await self._carry_out(tenant_id, plan_park(snap, tenant_id), "revoke")
                        self.metrics.preemptions.inc()  # one that could not be is tried again
                    went = True
            finally:
                if not went and held is not None and holds():
                    self._holding[tenant_id] = held  # it keeps its turn
                    if promised:  # and what the budget held for it (a park at its yield);
                        # a hint told to it during the read stands over what was held before
                        self._promised[tenant_id] = promised | self._promised.get(tenant_id, {})
                        self._revision += 1
            return went

    async def park(self, tenant_id: str) -> None:
        """Park the tenant now, on request (llm-d's Snapshot); `NoRoom` if it cannot be,
        `BackendError` if it left the node meanwhile."""
        async with self._lock:
            self._holding.pop(tenant_id, None)
            snap = await self._reread()
            _still_here(tenant_id, snap.tenants)
            await self._carry_out(tenant_id, plan_park(snap, tenant_id), "request")

    async def unpark(self, tenant_id: str) -> None:
        """Restore the tenant now, on request (llm-d's Restore), parking idle others for room;
        `BackendError` if it left the node meanwhile."""
        async with self._lock:
            ref = self._refs.get(tenant_id)
            await self._awake_again(ref.gpus if ref is not None else ())
            snap = await self._reread()
            _still_here(tenant_id, snap.tenants)
            await self._carry_out(tenant_id, plan_turn(snap, tenant_id), "request")

    async def forget(self, tenant_id: str) -> None:
        """Drop everything held for a tenant that is gone, parked bytes included. Until then a
        turn of its id (a pod's new process) is planned after this, under the lock."""
        with counted(self._forgetting, [tenant_id]):
            async with self._lock:
                await asyncio.to_thread(self.backend.detach, tenant_id)
                tables = (self._refs, self._last_turn, self._last_turn_wall, self._holding)
                for table in (*tables, self._promised):
                    table.pop(tenant_id, None)
                self._revision += 1
                self.quarantines.forget(tenant_id)
                self._model.forget(tenant_id)
                self._waiting.pop(tenant_id, None)
                self._refused.pop(tenant_id, None)
                self._publish()
                if self._host is not None:
                    self._host.persist()  # its parked record goes

    async def _make_room_for_holder(self, tenant_id: str) -> None:
        """Park idle tenants until the holder's memory fits (a tenant beside it outgrew what it
        declared); the holder keeps its turn either way."""
        try:
            async with self._lock:
                snap = await self._reread()
                if tenant_id in self._holding and tenant_id in snap.tenants:
                    log.warning("%s's turn is short of room after a read: making it", tenant_id)
                    await self._carry_out(tenant_id, plan_turn(snap, tenant_id), "grant")
        except Exception as e:  # it waits for the room, which its next grant makes
            log.warning("making room for %s during its turn failed: %s", tenant_id, e)


def _still_here(tenant_id: str, tenants: Collection[str]) -> None:
    """`BackendError` unless the tenant is still on the node: one that left has nothing to move
    (a request must not report a move that never happened)."""
    if tenant_id not in tenants:
        raise BackendError(f"{tenant_id} left the node: there is nothing to move")

"""llm-d's TimeSliceOrchestratorService over Baton's turns: a group's turn is a lease on its GPUs.

Acquire waits for Baton's grant, which comes once the job's memory is resident (no polling);
a job's calls that ask again while one waits wait for the same turn (`asking`), and the job
leaves the queue when the last of them goes away. Yield ends the turn at once: the
job's memory is parked only when another job's turn needs the room.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from agent.core.errors import AgentError, Forbidden
from agent.core.leases import Lease, Waiter
from agent.core.residency import NoRoom, parked_on, residency
from agent.parking.backends.base import BackendError
from agent.server.llmd import groups as g
from agent.server.llmd.asking import Asking
from agent.server.llmd.edge import BadRequest, mapped
from agent.server.llmd.jobs import Jobs
from agent.server.llmd.residency import job_state
from agent.server.resumes import Resumes
from agent.server.waits import HIDDEN
from baton._pb import snapshot_agent_pb2 as sa
from baton._pb import timeslice_orchestrator_pb2 as ts
from baton._pb import timeslice_orchestrator_pb2_grpc as ts_grpc
from baton.contract.deadline import answer_before

_STATES = {
    g.IDLE: ts.GroupStatus.STATE_IDLE,
    g.IDLE_YIELDED: ts.GroupStatus.STATE_IDLE_YIELDED,
    g.LOCKED: ts.GroupStatus.STATE_LOCKED,
    g.SWITCHING: ts.GroupStatus.STATE_SWITCHING,
}


class Orchestrator(ts_grpc.TimeSliceOrchestratorServiceServicer):
    """One per agent, sharing its `Jobs` with the snapshot-agent service."""

    def __init__(
        self,
        jobs: Jobs,
        node: str,
        moving: Callable[[str], bool],
        settled: Callable[[str], Awaitable[bool]],
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._jobs = jobs
        self._service = jobs.service
        self._node = node
        self._moving = moving
        self._settled = settled
        self._clock = clock or jobs.service.state.clock  # the events' clock: one time line
        self._since = g.StateClock()
        self._follower: asyncio.Task[None] | None = None
        self._asking = Asking(jobs.service)

    def start(self) -> None:
        """Follow the agent's events, so that each group's state timestamp is when it changed."""
        self._follower = asyncio.create_task(self._follow())

    async def stop(self) -> None:
        """Stop following events."""
        if self._follower is not None:
            self._follower.cancel()
            await asyncio.gather(self._follower, return_exceptions=True)

    async def _follow(self) -> None:
        async with self._service.events.subscribe() as events:
            while True:
                event = await events.get()
                for group in self._jobs.group_names():
                    try:
                        gpus = self._jobs.group_gpus(group, lambda tenant_id: True)
                    except AgentError:  # its last pod left just now
                        continue
                    if not event.gpus or set(event.gpus) & set(gpus):
                        self._since.observe(group, g.group_state(self._facts(gpus)), event.at)

    # Turns.

    @mapped
    async def Acquire(
        self, request: ts.AcquireRequest, context: grpc.aio.ServicerContext
    ) -> ts.AcquireResponse:
        """Wait for the group's turn with the job's memory resident; for the holder, only for a
        Snapshot or Restore of it under way and the restore of what a Snapshot parked."""
        tenant = await self._jobs.join(request.job_id, request.group_id, context.peer())
        seen = await self._jobs.seen_by(context.peer())
        gpus = self._jobs.turn_gpus(tenant, request.group_id, seen)
        lease = self._lease(tenant.tenant_id, gpus)
        if lease is not None:
            away = parked_on(self._service.preparer.residency_of(tenant.tenant_id), gpus)
            if await self._settled(tenant.tenant_id):  # its Snapshot or Restore ends first
                lease = self._lease(tenant.tenant_id, gpus)  # its turn may have ended meanwhile
            if lease is not None:
                restored = await self._restore_holder(tenant.tenant_id, lease) or away
                return ts.AcquireResponse(success=True, waited_ms=0, context_restored=restored)
        was_parked = parked_on(self._service.preparer.residency_of(tenant.tenant_id), gpus)
        asked = self._service.state.clock()
        timeout = answer_before(context.time_remaining())
        try:
            granted = await self._asking.acquire(tenant, gpus, timeout, request.job_id, seen)
        finally:  # the call named the job until its answer: its idle time counts from there
            self._jobs.seen(tenant.tenant_id)
        waited = max(0.0, granted.lease.granted_at - asked)
        return ts.AcquireResponse(
            success=True, waited_ms=int(waited * 1000), context_restored=was_parked
        )

    async def _restore_holder(self, tenant_id: str, lease: Lease) -> bool:
        """Restore a holder whose memory a Snapshot parked during its turn (whether it had to):
        Acquire answers with the job's context loaded. The move is not cut short by the caller's
        deadline (a move is bounded by `--move-timeout`)."""
        parking = self._service.parking
        if parking is None or not parked_on(
            self._service.preparer.residency_of(tenant_id), lease.gpus
        ):
            return False

        async def restore() -> None:
            try:
                await parking.unpark(tenant_id)
            except (NoRoom, BackendError) as exc:  # no room, or it left meanwhile
                raise AgentError(
                    f"job {self._jobs.job_of(tenant_id)!r} holds the turn but its memory, "
                    f"parked by a Snapshot, cannot be restored: {exc}"
                ) from None
            if self._lease(tenant_id, lease.gpus) is not None:  # its turn outlived the move
                self._service.preparer.held(tenant_id, lease.gpus)  # resident through it

        await asyncio.shield(restore())
        return True

    @mapped
    async def Yield(
        self, request: ts.YieldRequest, context: grpc.aio.ServicerContext
    ) -> ts.YieldResponse:
        """End the job's turn (one the node revoked and has yet to give back too: it is not
        given back); PERMISSION_DENIED if it does not hold the group's turn."""
        seen = await self._jobs.seen_by(context.peer())
        gpus = self._jobs.group_gpus(request.group_id, seen)
        if not request.job_id:
            raise BadRequest("job_id is required")
        caller = await self._jobs.caller(context.peer())
        tenant = self._jobs.find(request.job_id, request.group_id, caller)
        turn = self._jobs.turn_gpus(tenant, request.group_id, seen) if tenant else ()
        lease = self._lease(tenant.tenant_id, turn) if tenant else None
        revoked = (  # the node revoked the job's turn and has yet to give it back
            lease is None
            and tenant is not None
            and Resumes.queued(tenant.tenant_id, turn, self._service.table) is not None
        )
        if tenant is None or (lease is None and not revoked):
            holder = self._holder(gpus)
            held_by = self._jobs.job_of(holder.tenant_id) if holder else "nobody"
            if holder and not seen(holder.tenant_id):
                held_by = HIDDEN
            if held_by == request.job_id:  # its turn on another group covers these GPUs
                held_by += ", on another group: yield with that group_id"
            raise Forbidden(
                f"job {request.job_id!r} does not hold group {request.group_id!r}'s turn "
                f"(held by {held_by})"
            )
        self._jobs.check_caller(tenant, caller)
        waiting = {
            w.tenant_id
            for w in self._service.table.waiters.values()
            if set(w.gpus) & set(gpus) and w.tenant_id != tenant.tenant_id
        }
        if lease is None:  # revoked (its --max-hold, a higher tier): given back meanwhile?
            lease = self._lease(tenant.tenant_id, turn)
        if lease is None:  # not given back now
            self._service.give_up_resume(tenant, turn)
        else:
            self._service.yield_(tenant, lease.lease_id)
        return ts.YieldResponse(
            success=True, pending_waiters=len(waiting), snapshot_deferred=not waiting
        )

    # Status.

    @mapped
    async def ListGroups(
        self, request: ts.ListGroupsRequest, context: grpc.aio.ServicerContext
    ) -> ts.ListGroupsResponse:
        """Every group on this node the caller may see (another namespace's pods' labels are
        that namespace's)."""
        seen = await self._jobs.seen_by(context.peer())
        return ts.ListGroupsResponse(group_ids=self._jobs.group_names(seen))

    @mapped
    async def GetGroupStatus(
        self, request: ts.GetGroupStatusRequest, context: grpc.aio.ServicerContext
    ) -> ts.GetGroupStatusResponse:
        """The group's state from Baton's lease table and residency layer; a job the caller may
        not see (another namespace's) is counted, not named: its id is "", and it has no entry."""
        seen = await self._jobs.seen_by(context.peer())
        gpus = self._jobs.group_gpus(request.group_id, seen)
        if request.group_id not in self._jobs.group_names(seen):
            raise self._jobs.unknown_group(request.group_id, seen)
        facts = self._facts(gpus)
        state = g.group_state(facts)
        stamp = Timestamp()
        stamp.FromNanoseconds(
            int(self._since.observe(request.group_id, state, self._clock()) * 1e9)
        )

        def job(tenant_id: str) -> str:
            return self._jobs.job_of(tenant_id) if seen(tenant_id) else ""

        status = ts.GroupStatus(
            group_id=request.group_id,
            group_state=_STATES[state],
            state_timestamp=stamp,
            locking_job=job(facts.holder) if facts.holder else "",
            active_job=job(facts.holder or facts.switching_to or facts.last_holder)
            if facts.holder or facts.switching_to or facts.last_holder
            else "",
            waiter_queue_depth=len({w.waiter_id for gpu in gpus for w in self._queue(gpu)}),
            loaded_job=job(facts.loaded) if facts.loaded else "",
        )
        states = self._job_states(gpus, seen)
        return ts.GetGroupStatusResponse(group=status, agent_job_states=states)

    def _job_states(
        self, gpus: tuple[str, ...], seen: Callable[[str], bool]
    ) -> list[ts.SnapshotAgentJobState]:
        where = residency(self._service.preparer)
        parks = bool(self._service.preparer.status())
        states = []
        for job_id, tenant in sorted(self._jobs.job_ids(seen).items()):
            if not set(tenant.gpus) & set(gpus):
                continue
            moving = self._moving(tenant.tenant_id) or self._switching(tenant.tenant_id, gpus)
            state = job_state(where.get(tenant.tenant_id, {}), moving, parks)
            name = sa.JobState.Name(state).replace("JOB_STATE_", "STATE_")
            states.append(
                ts.SnapshotAgentJobState(
                    agent=self._node,
                    job_state=name,
                    job_id=job_id,
                )
            )
        return states

    # Facts.

    def _facts(self, gpus: tuple[str, ...]) -> g.GroupFacts:
        holder = self._holder(gpus)
        switching = next(
            (
                w.tenant_id
                for w in self._service.table.waiters.values()
                if w.reserved and set(w.gpus) & set(gpus)
            ),
            "",
        )
        served = [
            (when, tenant_id)
            for gpu in gpus
            for tenant_id, when in self._service.table.gpu(gpu).served.items()
        ]
        last = max(served)[1] if served else ""
        current = holder.tenant_id if holder else ""
        return g.GroupFacts(
            holder=current,
            switching_to=switching,
            loaded=self._loaded(gpus, current or last),
            last_holder=last,
        )

    def _loaded(self, gpus: tuple[str, ...], likely: str) -> str:
        """The job whose memory is resident on the group, preferring the (last) holder."""
        if not self._service.preparer.status():  # nothing is ever parked
            return likely
        resident = sorted(
            tid
            for tid, where in residency(self._service.preparer).items()
            if tid in self._jobs.service.tenants.tenants
            and any(where.get(gpu) == "resident" for gpu in gpus)
        )
        return likely if likely in resident else (resident[0] if resident else "")

    def _switching(self, tenant_id: str, gpus: tuple[str, ...]) -> bool:
        return any(
            w.reserved and w.tenant_id == tenant_id and set(w.gpus) & set(gpus)
            for w in self._service.table.waiters.values()
        )

    def _queue(self, gpu: str) -> list[Waiter]:
        return [w for w in self._service.table.queue_of(gpu) if not w.reserved]

    def _holder(self, gpus: tuple[str, ...]) -> Lease | None:
        return next(
            (lease for lease in self._service.table.leases.values() if set(lease.gpus) & set(gpus)),
            None,
        )

    def _lease(self, tenant_id: str, gpus: tuple[str, ...]) -> Lease | None:
        return next(
            (
                lease
                for lease in self._service.table.leases_of(tenant_id)
                if set(lease.gpus) == set(gpus)
            ),
            None,
        )

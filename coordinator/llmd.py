"""llm-d's TimeSliceOrchestratorService, served cluster-wide by the leading coordinator.

A group's turn for a job is that job's turn on the group's members (`coordinator.cluster`), on
every node at once. Acquire waits for it (once all nodes have made room), Yield ends it on every
node. llm-d's requests name no namespace: the job is looked up by its id among the namespaces the
caller may drive (`coordinator.callers`): its own, or, for an unidentified caller where the
operator allows it (`--allow-unidentified`), the one namespace that has that job.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from agent.core.errors import AlreadyHolding
from baton._pb import timeslice_orchestrator_pb2 as ts
from baton._pb import timeslice_orchestrator_pb2_grpc as ts_grpc
from baton.contract.deadline import answer_before
from coordinator.callers import CallerUnknown
from coordinator.cluster import ClusterView, PlanError, UnknownGroup, UnknownJob
from coordinator.jobturn import NotHolder, parse_turn_key, sees
from coordinator.turns import Arbiter, NotLeading, TurnFailed


class Refused(Exception):
    """A call refused before it reaches a turn; `code` says how."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


_CODES: list[tuple[type[Exception], grpc.StatusCode]] = [
    (UnknownJob, grpc.StatusCode.NOT_FOUND),
    (UnknownGroup, grpc.StatusCode.NOT_FOUND),
    (PlanError, grpc.StatusCode.FAILED_PRECONDITION),
    (NotHolder, grpc.StatusCode.PERMISSION_DENIED),
    (NotLeading, grpc.StatusCode.UNAVAILABLE),
    (CallerUnknown, grpc.StatusCode.UNAVAILABLE),
    (TurnFailed, grpc.StatusCode.UNAVAILABLE),
    (TimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (AlreadyHolding, grpc.StatusCode.FAILED_PRECONDITION),
]

Req = TypeVar("Req")
Resp = TypeVar("Resp")


def mapped(
    handler: Callable[[Any, Req, grpc.aio.ServicerContext], Awaitable[Resp]],
) -> Callable[[Any, Req, grpc.aio.ServicerContext], Awaitable[Resp]]:
    @functools.wraps(handler)
    async def wrapper(self: Any, request: Req, context: grpc.aio.ServicerContext) -> Resp:
        try:
            return await handler(self, request, context)
        except Refused as exc:
            await context.abort(exc.code, str(exc))
        except tuple(kind for kind, _ in _CODES) as exc:
            code = next(c for kind, c in _CODES if isinstance(exc, kind))
            text = str(exc) or "the turn was not granted before the call's deadline"
            await context.abort(code, text)
        raise AssertionError("abort() raises")

    return wrapper


class LlmdOrchestrator(ts_grpc.TimeSliceOrchestratorServiceServicer):
    """llm-d's orchestrator API over the arbiter."""

    def __init__(
        self,
        arbiter: Arbiter,
        view: ClusterView,
        namespace_of: Callable[[str, bool], Awaitable[str | None]],
        allow_unidentified: bool = False,
    ) -> None:
        self._arbiter = arbiter
        self._view = view
        self._namespace_of = namespace_of
        self._allow_unidentified = allow_unidentified

    async def _namespace(
        self, job: str, context: grpc.aio.ServicerContext, ending: bool = False
    ) -> tuple[str, bool]:
        """The job's namespace, and whether the caller may see every namespace's jobs (an
        unidentified caller, where `--allow-unidentified` lets it drive any); `ending`: the
        call gives the turn back (a pod in deletion may make it: `coordinator.callers`)."""
        if not job:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "job_id is required")
        have = self._view.namespaces_of(job)
        caller = await self._namespace_of(context.peer(), ending)
        if caller is not None:
            if not have:
                raise Refused(grpc.StatusCode.NOT_FOUND, f"no pod carries job {job!r}")
            if caller not in have:
                raise Refused(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"job {job!r} is in namespace {', '.join(have)}: a caller from namespace "
                    f"{caller} may drive only its own namespace's jobs",
                )
            return caller, False
        if not self._allow_unidentified:
            raise Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"the caller at {context.peer()} is no pod this coordinator can identify, so it "
                "may drive no job (call from the job's pods)",
            )
        if len(have) != 1:
            where = f"in namespaces {', '.join(have)}" if have else "nowhere"
            raise Refused(
                grpc.StatusCode.NOT_FOUND if not have else grpc.StatusCode.FAILED_PRECONDITION,
                f"job {job!r} is {where}; an unidentified caller must name a job of one namespace",
            )
        return have[0], True

    async def _viewer(self, context: grpc.aio.ServicerContext) -> str | None:
        """The namespace whose groups and jobs the caller sees by name (`jobturn.sees`): its
        own; None, every one, for an unidentified caller the operator lets drive any job
        (`--allow-unidentified`); "", none, for another unidentified one."""
        caller = await self._namespace_of(context.peer(), False)
        if caller is None:
            return None if self._allow_unidentified else ""
        return caller

    @mapped
    async def Acquire(
        self, request: ts.AcquireRequest, context: grpc.aio.ServicerContext
    ) -> ts.AcquireResponse:
        """Wait for the job's turn on the group, on every node; at once for the holder."""
        namespace, every = await self._namespace(request.job_id, context)
        timeout = answer_before(context.time_remaining())
        turn = await self._arbiter.acquire(
            namespace, request.job_id, request.group_id, timeout, every=every
        )
        return ts.AcquireResponse(
            success=True, waited_ms=int(turn.waited * 1000), context_restored=turn.restored
        )

    @mapped
    async def Yield(
        self, request: ts.YieldRequest, context: grpc.aio.ServicerContext
    ) -> ts.YieldResponse:
        """End the job's turn on the group; PERMISSION_DENIED if it does not hold it."""
        namespace, every = await self._namespace(request.job_id, context, ending=True)
        waiting = await self._arbiter.yield_(namespace, request.job_id, request.group_id, every)
        return ts.YieldResponse(
            success=True, pending_waiters=waiting, snapshot_deferred=not waiting
        )

    @mapped
    async def ListGroups(
        self, request: ts.ListGroupsRequest, context: grpc.aio.ServicerContext
    ) -> ts.ListGroupsResponse:
        """Every group a node or a pod of the caller's namespace names (another namespace's
        pods' labels are that namespace's)."""
        self._arbiter.check_leading()
        viewer = await self._viewer(context)
        return ts.ListGroupsResponse(group_ids=self._view.groups(functools.partial(sees, viewer)))

    @mapped
    async def GetGroupStatus(
        self, request: ts.GetGroupStatusRequest, context: grpc.aio.ServicerContext
    ) -> ts.GetGroupStatusResponse:
        """The group's state from the arbiter: who holds it, who is being switched in, who waits
        (a job of another namespace than the caller's is counted, not named: its id is "")."""
        self._arbiter.check_leading()  # a standby's table is empty: it would say IDLE
        group = request.group_id
        viewer = await self._viewer(context)
        resources = self._view.group_resources(group)
        if not resources or group not in self._view.groups(functools.partial(sees, viewer)):
            raise UnknownGroup(f"no node or pod of the caller's namespace is in group {group!r}")
        arbiter = self._arbiter
        holder = arbiter.holder_of(resources)
        switching = arbiter.switching(resources)
        served = [
            (when, tenant)
            for r in resources
            for tenant, when in arbiter.table.gpu(r).served.items()
        ]
        last = max(served)[1] if served else ""
        if holder is not None:
            state = ts.GroupStatus.STATE_LOCKED
        elif switching:
            state = ts.GroupStatus.STATE_SWITCHING
        else:
            state = ts.GroupStatus.STATE_IDLE_YIELDED if last else ts.GroupStatus.STATE_IDLE
        stamp = Timestamp()
        changed = max((arbiter.changed_at.get(r, 0.0) for r in resources), default=0.0)
        stamp.FromNanoseconds(int(changed * 1e9))

        def job(key: str) -> str:
            namespace, name, _ = parse_turn_key(key)
            return name if sees(viewer, namespace) else ""

        active = holder.key if holder else switching or last
        status = ts.GroupStatus(
            group_id=group,
            group_state=state,
            state_timestamp=stamp,
            locking_job=job(holder.key) if holder else "",
            active_job=job(active) if active else "",
            waiter_queue_depth=arbiter.waiting(resources),
            loaded_job=job(holder.key if holder else last) if holder or last else "",
        )
        states = []
        if holder is not None:
            states = [
                ts.SnapshotAgentJobState(
                    agent=node, job_state="STATE_RUNNING", job_id=job(holder.key)
                )
                for node in sorted(holder.nodes)
            ]
        return ts.GetGroupStatusResponse(group=status, agent_job_states=states)

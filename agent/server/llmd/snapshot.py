"""llm-d's SnapshotAgentService over Baton's parking layer: Snapshot parks, Restore brings back.

Both return an operation at once and move the memory in the background; GetOperation reports
PENDING, COMPLETE (with the bytes the backend really moved and holds) or FAILED, with the time
taken. The BackendConfig picks the parking method (`cuda`: the driver's checkpoint, only of the
job's own processes; `app_channel`: the job's WorkloadChannel; none: the job's own method); a
config the node has no method for is refused with what it serves, never run as another.
The last `KEEP` finished operations are kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from agent.core.errors import AgentError
from agent.core.residency import residency
from agent.node.tenants import Tenant
from agent.parking.backends.base import BackendError
from agent.parking.backends.endpoint import SGLANG, VLLM, EndpointBackend, EndpointTarget
from agent.parking.host import Parking
from agent.parking.methods import APP, CUDA, ENDPOINT, NONE, PLAIN, described
from agent.server.llmd.channel import Channels
from agent.server.llmd.edge import (
    BadRequest,
    MethodMissing,
    NotImplementedHere,
    Transitioning,
    UnknownOperation,
    mapped,
)
from agent.server.llmd.jobs import Jobs
from agent.server.llmd.residency import bytes_of, job_state
from baton._pb import snapshot_agent_pb2 as sa
from baton._pb import snapshot_agent_pb2_grpc as sa_grpc

KEEP = 1024
NOT_IMPLEMENTED = ("direct_memory", "memory_regions")
"""BackendConfigs Baton has no method for: refused as UNIMPLEMENTED, never run as another."""
APPS = {sa.APP_VLLM: VLLM, sa.APP_SGLANG: SGLANG}
METHOD_KEY = "baton-parking-method"
"""GetOperation's trailing metadata: the parking method the operation used."""


class WrongState(AgentError):
    """Snapshot of a job that is not running, or Restore of one not saved (FAILED_PRECONDITION)."""


@dataclass
class Operation:
    """One snapshot or restore."""

    op_id: str
    tenant_id: str
    started: float
    method: str
    """The parking method that moves the memory (`cuda`, `app`, `fake`)."""
    status: sa.OperationStatus = sa.OPERATION_STATUS_PENDING
    finished: float | None = None
    storage_bytes: int = 0
    device_bytes: int = 0
    error: str = ""

    def to_pb(self, now: float) -> sa.GetOperationResponse:
        """The wire form; bytes only on COMPLETE, the error only on FAILED."""
        elapsed = int(((self.finished or now) - self.started) * 1000)
        reply = sa.GetOperationResponse(status=self.status, elapsed_ms=elapsed)
        if self.status == sa.OPERATION_STATUS_COMPLETE:
            reply.storage_bytes, reply.snapshot_device_bytes = self.storage_bytes, self.device_bytes
        elif self.status == sa.OPERATION_STATUS_FAILED:
            reply.error = self.error
        return reply


class SnapshotAgent(sa_grpc.SnapshotAgentServiceServicer):
    """One per agent, sharing its `Jobs` with the orchestrator service."""

    def __init__(
        self, jobs: Jobs, channels: Channels, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._jobs = jobs
        self._channels = channels
        self._clock = clock
        self._ops: OrderedDict[str, Operation] = OrderedDict()
        self._ids = itertools.count(1)
        self._tasks: dict[asyncio.Task[None], Operation] = {}
        """The operations under way, by the task that runs each."""
        self._choosing: dict[asyncio.Future[None], str] = {}
        """Snapshot and Restore calls still choosing their method (no operation yet), by tenant."""

    def moving(self, tenant_id: str) -> bool:
        """Whether the tenant's memory is moving: an operation on it is still running, or the
        agent is moving it for a turn (its own, or another job's)."""
        parking = self._jobs.service.parking
        return (parking is not None and parking.moving(tenant_id)) or any(
            op.tenant_id == tenant_id and op.status == sa.OPERATION_STATUS_PENDING
            for op in self._ops.values()
        )

    async def settled(self, tenant_id: str) -> bool:
        """Return once the Snapshots and Restores of the tenant under way now have ended, those
        still choosing their method too (their moves are bounded by the backend's timeouts);
        whether there were any."""
        choosing = [done for done, tid in self._choosing.items() if tid == tenant_id]
        if choosing:  # each has started its operation, or been refused, by then
            await asyncio.wait(choosing)
        running = [task for task, op in self._tasks.items() if op.tenant_id == tenant_id]
        if running:
            await asyncio.wait(running)
        return bool(choosing or running)

    @contextlib.contextmanager
    def _under_way(self, tenant_id: str) -> Iterator[None]:
        """A Snapshot or Restore of the tenant between its checks and its operation."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._choosing[done] = tenant_id
        try:
            yield
        finally:
            del self._choosing[done]
            done.set_result(None)

    async def stop(self) -> None:
        """Cancel operations in flight."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _endpoint_target(self, cfg: sa.AppEndpointConfig, tenant: Tenant) -> EndpointTarget:
        """The engine, its checked endpoints, mode and tags an app_endpoint config names."""
        app = APPS.get(cfg.app)
        if app is None:
            raise BadRequest("app_endpoint needs app APP_VLLM or APP_SGLANG")
        if not cfg.endpoints:
            raise BadRequest("app_endpoint needs at least one endpoint")
        urls = await self._jobs.check_endpoints(tenant, cfg.endpoints)
        mode = "discard" if cfg.mode == sa.SUSPEND_MODE_DISCARD else "offload"
        return EndpointTarget(app, urls, mode, tuple(cfg.tags))

    async def _method(self, config: sa.BackendConfig, tenant: Tenant) -> tuple[Parking, str]:
        """The parking and the method that will do what `config` asks, or the refusal why not."""
        parking = self._jobs.service.parking
        if parking is None:
            raise MethodMissing(
                f"this agent parks nothing (--backend {NONE}); start it with --backend "
                f"{described([m for m in PLAIN if m != NONE])} (or several, e.g. {CUDA},{APP})"
            )
        tid = tenant.tenant_id
        serves = ", ".join(parking.methods())
        kind = config.WhichOneof("backend")
        if kind in NOT_IMPLEMENTED:
            raise NotImplementedHere(
                f"BackendConfig {kind} is not implemented by Baton; this node parks with "
                f"{serves} (ask for cuda or app_channel, or send no config)"
            )
        current = parking.method_of(tid)
        want = current
        if kind == "app_channel":
            want = APP
            if self._channels.of(tid) is None:
                raise MethodMissing(
                    f"app_channel needs job {self._jobs.job_of(tid)!r}'s WorkloadChannel registered"
                )
        elif kind == "app_endpoint":
            want = ENDPOINT
            target = await self._endpoint_target(config.app_endpoint, tenant)
        elif kind == "cuda":  # the BackendConfig field, asking for the cuda method
            want = CUDA
            pids = list(config.cuda.explicit_target.pids)
            self._jobs.check_pids(tenant, pids)
            if CUDA in parking.methods() and self._jobs.service.tenants.add_pids(tenant, pids):
                self._jobs.service.state.journal_tenant(tenant)
        if want not in parking.methods():
            raise MethodMissing(f"{kind} needs the {want} method; this node parks with {serves}")
        if kind == "app_endpoint":
            endpoints = parking.backend_for(ENDPOINT)
            assert isinstance(endpoints, EndpointBackend)
            endpoints.configure(tid, target)
        if kind is not None and len(parking.methods()) > 1:  # asked for among several: pinned
            try:
                await parking.pin(tid, want)  # under the preparer's lock, as a move
            except BackendError as exc:
                raise MethodMissing(str(exc)) from None
            self._jobs.service.persist()  # the method is in the parking record
        return parking, want

    async def _job(self, job_id: str, group: str, context: grpc.aio.ServicerContext) -> Tenant:
        tenant = await self._jobs.check(job_id, group, context.peer())
        self._state(tenant, job_id)
        return tenant

    def _state(self, tenant: Tenant, job_id: str) -> sa.JobState:
        """The job's state; `Transitioning` (ABORTED, which llm-d's client tries again) while
        its memory moves, for an operation or for a turn."""
        where = self._jobs.service.preparer.residency_of(tenant.tenant_id)
        state = job_state(where, self.moving(tenant.tenant_id), parks=True)
        if state == sa.JOB_STATE_TRANSITIONING:
            raise Transitioning(f"job {job_id!r}'s memory is being moved; try again")
        return state

    @mapped
    async def Snapshot(
        self, request: sa.SnapshotRequest, context: grpc.aio.ServicerContext
    ) -> sa.SnapshotResponse:
        """Park the job's memory in host DRAM (an operation)."""
        tenant = await self._job(request.job_id, request.group, context)
        with self._under_way(tenant.tenant_id):  # the holder's Acquire waits for it
            parking, method = await self._method(request.backend_config, tenant)
            if self._state(tenant, request.job_id) != sa.JOB_STATE_RUNNING:
                raise WrongState(
                    f"job {request.job_id!r} is not RUNNING: there is nothing to snapshot"
                )
            channel = self._channels.of(tenant.tenant_id)
            if channel is not None:
                cfg = request.backend_config.app_channel
                channel.next_snapshot(cfg.mode, cfg.tags or channel.tags)
            op = self._start(tenant.tenant_id, parking.park(tenant.tenant_id), False, method)
            return sa.SnapshotResponse(operation_id=op.op_id)

    @mapped
    async def Restore(
        self, request: sa.RestoreRequest, context: grpc.aio.ServicerContext
    ) -> sa.RestoreResponse:
        """Bring the job's parked memory back to its GPUs (an operation)."""
        tenant = await self._job(request.job_id, request.group, context)
        with self._under_way(tenant.tenant_id):  # the holder's Acquire waits for it
            parking, method = await self._method(request.backend_config, tenant)
            if self._state(tenant, request.job_id) != sa.JOB_STATE_SAVED:
                raise WrongState(
                    f"job {request.job_id!r} is not SAVED: there is nothing to restore"
                )
            channel = self._channels.of(tenant.tenant_id)
            if channel is not None and method == APP:
                channel.next_restore(request.backend_config.app_channel.tags or channel.tags)
            op = self._start(tenant.tenant_id, parking.unpark(tenant.tenant_id), True, method)
            return sa.RestoreResponse(operation_id=op.op_id)

    def _start(
        self, tenant_id: str, move: Coroutine[Any, Any, None], restore: bool, method: str
    ) -> Operation:
        op = Operation(f"op-{next(self._ids)}", tenant_id, self._clock(), method)
        self._ops[op.op_id] = op
        while len(self._ops) > KEEP:
            self._ops.popitem(last=False)
        task = asyncio.create_task(self._run(op, move, restore))
        self._tasks[task] = op
        task.add_done_callback(lambda done: self._tasks.pop(done, None))
        return op

    async def _run(self, op: Operation, move: Coroutine[Any, Any, None], restore: bool) -> None:
        preparer = self._jobs.service.preparer
        held_before, _ = bytes_of(preparer, op.tenant_id)
        try:
            await move
        except Exception as exc:  # NoRoom, a failed move: the operation says why
            op.status, op.error = sa.OPERATION_STATUS_FAILED, str(exc) or type(exc).__name__
            if not restore:  # a holder it took off the holders stays one (its memory stays)
                self._hold_turns(op.tenant_id)
        else:
            held, device = bytes_of(preparer, op.tenant_id)
            parking = self._jobs.service.parking
            if not restore and parking is not None:  # the one that parked it
                op.method = parking.method_of(op.tenant_id)
            if restore:  # back in a turn it holds (a Snapshot took it off): it stays resident
                self._hold_turns(op.tenant_id)
            op.status = sa.OPERATION_STATUS_COMPLETE
            op.storage_bytes, op.device_bytes = (held_before if restore else held), device
        op.finished = self._clock()

    def _hold_turns(self, tenant_id: str) -> None:
        """Count the tenant holding the turns it holds: no other turn parks it during them."""
        for lease in self._jobs.service.table.leases_of(tenant_id):
            self._jobs.service.preparer.held(tenant_id, lease.gpus)

    @mapped
    async def GetOperation(
        self, request: sa.GetOperationRequest, context: grpc.aio.ServicerContext
    ) -> sa.GetOperationResponse:
        """Where an operation is."""
        op = self._ops.get(request.operation_id)
        if op is None:
            raise UnknownOperation(f"no operation {request.operation_id!r} on this agent")
        context.set_trailing_metadata(((METHOD_KEY, op.method),))
        return op.to_pb(self._clock())

    @mapped
    async def Status(
        self, request: sa.StatusRequest, context: grpc.aio.ServicerContext
    ) -> sa.StatusResponse:
        """The state of every job the caller may see (not another namespace's), and each GPU's
        memory in use."""
        seen = await self._jobs.seen_by(context.peer())
        parking = self._jobs.service.parking
        parks = parking is not None
        where = residency(self._jobs.service.preparer)
        jobs = [
            sa.JobStatus(
                job_id=job_id,
                state=job_state(
                    where.get(tenant.tenant_id, {}), self.moving(tenant.tenant_id), parks
                ),
            )
            for job_id, tenant in sorted(self._jobs.job_ids(seen).items())
        ]
        gpus = []
        if parking is not None:
            used = parking.resident_bytes()
            gpus = [
                sa.AcceleratorStatus(
                    id=gpu, memory_used_bytes=used.get(gpu, 0), memory_total_bytes=total
                )
                for gpu, total in sorted(parking.gpu_memory.items())
            ]
        return sa.StatusResponse(job_statuses=jobs, accelerator_statuses=gpus)

    async def WorkloadChannel(
        self, request_iterator: AsyncIterator[sa.WorkloadMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[sa.AgentCommand]:
        """Register a workload; the agent pushes its snapshot and restore commands."""
        async for command in self._channels.serve(request_iterator, context):
            yield command

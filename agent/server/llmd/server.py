"""The llm-d listener: orchestrator, snapshot agent and grpc.health.v1 on one plaintext port."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import grpc

from agent.server.llmd.channel import Channels
from agent.server.llmd.groups import Groups, GroupSpecError
from agent.server.llmd.jobs import Jobs
from agent.server.llmd.orchestrator import Orchestrator
from agent.server.llmd.snapshot import SnapshotAgent
from agent.server.service import LeaseService
from baton._pb import health_pb2 as hp
from baton._pb import health_pb2_grpc as hp_grpc
from baton._pb import snapshot_agent_pb2_grpc as sa_grpc
from baton._pb import timeslice_orchestrator_pb2_grpc as ts_grpc
from baton.contract.tcpbind import bind_error, served_at

log = logging.getLogger(__name__)

SERVICES = (
    "timeslice_orchestrator.v1alpha1.TimeSliceOrchestratorService",
    "snapshot_agent.v1alpha1.SnapshotAgentService",
)


class Health(hp_grpc.HealthServicer):
    """SERVING for the whole server (""), each llm-d service and each of the agent's parking
    methods (`backend`: their names separated by commas)."""

    def __init__(self, backend: str) -> None:
        self._known = {"", *SERVICES, *backend.split(",")}
        self._stopping = asyncio.Event()

    def _status(self, service: str) -> hp.HealthCheckResponse.ServingStatus:
        if service not in self._known:
            return hp.HealthCheckResponse.SERVICE_UNKNOWN
        return hp.HealthCheckResponse.SERVING

    async def Check(
        self, request: hp.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> hp.HealthCheckResponse:
        """The service's status; NOT_FOUND for one this server does not have."""
        if request.service not in self._known:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return hp.HealthCheckResponse(status=self._status(request.service))

    async def Watch(
        self, request: hp.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[hp.HealthCheckResponse]:
        """The status now, then NOT_SERVING when the agent stops."""
        yield hp.HealthCheckResponse(status=self._status(request.service))
        await self._stopping.wait()
        yield hp.HealthCheckResponse(status=hp.HealthCheckResponse.NOT_SERVING)

    def stop(self) -> None:
        """The agent is stopping."""
        self._stopping.set()


class LlmdServer:
    """Serves llm-d's time-slicing API for one agent; `start`, then `stop`."""

    def __init__(
        self,
        service: LeaseService,
        listen: str,
        groups: Groups,
        gpu_memory: Mapping[str, int],
        node: str,
        backend: str,
        proc_root: Path = Path("/proc"),
        idle_after: float = 0.0,
    ) -> None:
        self._service = service
        self._listen = listen
        self._groups = groups
        self._gpu_memory = gpu_memory
        self._node = node
        self._backend = backend
        self._proc_root = proc_root
        self._idle_after = idle_after
        self._server: grpc.aio.Server | None = None
        self._orchestrator: Orchestrator | None = None
        self._snapshots: SnapshotAgent | None = None
        self._health: Health | None = None
        self.jobs: Jobs | None = None
        self.port = 0

    async def start(self) -> int:
        """Bind and serve; returns the port (for `:0`). RuntimeError, saying which flag is wrong,
        if it cannot listen or a group names a GPU this node does not have."""
        try:
            self._groups.check_gpus(self._gpu_memory)
        except GroupSpecError as exc:
            raise RuntimeError(f"--llmd-group {exc}") from None
        self._server = grpc.aio.server()
        try:
            self.port = self._server.add_insecure_port(self._listen)
        except RuntimeError:
            self.port = 0
        if not self.port:
            why = bind_error(self._listen)
            raise RuntimeError(f"--llmd-listen {self._listen}: cannot listen there ({why})")
        self.jobs = Jobs(
            self._service,
            self._groups,
            self._gpu_memory,
            self.port,
            self._proc_root,
            self._idle_after,
        )
        channels = Channels(self.jobs)
        self._snapshots = SnapshotAgent(self.jobs, channels)
        self._orchestrator = Orchestrator(
            self.jobs, self._node, self._snapshots.moving, self._snapshots.settled
        )
        self._health = Health(self._backend)
        ts_grpc.add_TimeSliceOrchestratorServiceServicer_to_server(self._orchestrator, self._server)
        sa_grpc.add_SnapshotAgentServiceServicer_to_server(self._snapshots, self._server)
        hp_grpc.add_HealthServicer_to_server(self._health, self._server)
        await self._server.start()
        self._orchestrator.start()
        log.info(
            "llm-d API on %s (groups: %s)",
            served_at(self._listen, self.port), ", ".join(self._groups.names()),
        )  # fmt: skip
        return self.port

    async def stop(self, grace: float) -> None:
        """Stop serving; turns stay with the lease service."""
        if self._health is not None:
            self._health.stop()
        if self._server is not None:
            await self._server.stop(grace)
        if self._orchestrator is not None:
            await self._orchestrator.stop()
        if self._snapshots is not None:
            await self._snapshots.stop()
        if self.jobs is not None:
            self.jobs.close()

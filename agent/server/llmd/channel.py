"""llm-d's WorkloadChannel: a registered workload becomes a tenant of the `app` backend.

The workload registers its job, group and capabilities; from then on, when Baton parks or
restores that tenant, the app backend's park/restore callback travels down the stream as a
SnapshotCommand or RestoreCommand, and the workload's CommandResult answers it. One command
per job per GPU set: the first GPU's park sends the command, the others ride on it. A new
registration of the same job replaces the old stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence

import grpc

from agent.core.errors import AgentError
from agent.server.llmd.edge import BadRequest, status_code
from agent.server.llmd.jobs import Jobs
from agent.server.sessions import Session
from baton._pb import agent_pb2 as pb
from baton._pb import snapshot_agent_pb2 as sa
from baton.contract.names import MIB

log = logging.getLogger(__name__)

_MODES = (sa.SUSPEND_MODE_OFFLOAD, sa.SUSPEND_MODE_DISCARD)


class ChannelSession(Session):
    """A workload's open WorkloadChannel, standing in for a session with park/restore callbacks."""

    names_revoked = False  # llm-d's API has no revoked lease to name

    def __init__(
        self,
        tenant_id: str,
        pid: int,
        capabilities: sa.WorkloadCapabilities,
        bytes_per_gpu: int,
        snapshotted: bool = False,
    ) -> None:
        super().__init__(tenant_id, pid, token="", callbacks=frozenset({"park", "restore"}))
        self.supported = set(capabilities.supported_modes)
        self.default_mode = capabilities.default_mode
        self.tags = list(capabilities.tags)
        self.bytes_per_gpu = bytes_per_gpu
        self.commands: asyncio.Queue[sa.AgentCommand | None] = asyncio.Queue()
        self.error = ""
        self._actions: dict[str, str] = {}
        self._snapshotted = snapshotted
        """Whether the workload is snapshotted: a stream registered while the job is parked (a
        reconnect, a replacement) starts so, or its restore would be answered without a command."""
        self._next: tuple[sa.SuspendMode, list[str]] | None = None
        self._next_restore: list[str] | None = None

    def mode_for(self, requested: sa.SuspendMode) -> sa.SuspendMode:
        """The request's mode, else the registered default, else OFFLOAD; checked as supported."""
        mode = requested or self.default_mode or sa.SUSPEND_MODE_OFFLOAD
        if self.supported and mode not in self.supported:
            raise BadRequest(
                f"mode {sa.SuspendMode.Name(mode)} is not among the workload's supported modes"
            )
        return mode

    def next_snapshot(self, mode: sa.SuspendMode, tags: Sequence[str]) -> None:
        """The next snapshot comes from a Snapshot request with this mode and these tags."""
        self._next = (self.mode_for(mode), list(tags))

    def next_restore(self, tags: Sequence[str]) -> None:
        """The next restore comes from a Restore request with these tags."""
        self._next_restore = list(tags)

    def send(self, message: pb.AgentMessage) -> None:
        """Turn an app-backend callback into a command on the stream; other pushes do not apply."""
        if message.WhichOneof("kind") != "callback":
            return
        call = message.callback
        parking = call.action == "park"
        if parking == self._snapshotted:  # another GPU of the same job: the command covered it
            self.resolve(pb.CallbackResult(call_id=call.call_id, bytes=self.bytes_per_gpu))
            return
        command = sa.AgentCommand(command_id=call.call_id)
        if parking:
            mode, tags = self._next or (self.mode_for(sa.SUSPEND_MODE_UNSPECIFIED), self.tags)
            self._next = None
            command.snapshot.CopyFrom(sa.SnapshotCommand(mode=mode, tags=tags))
        else:
            tags = self.tags if self._next_restore is None else self._next_restore
            self._next_restore = None
            command.restore.CopyFrom(sa.RestoreCommand(tags=tags))
        self._actions[call.call_id] = call.action
        self.commands.put_nowait(command)

    def answer(self, result: sa.CommandResult) -> None:
        """The workload finished a command."""
        action = self._actions.pop(result.command_id, None)
        if action is None:
            return
        if result.ok:
            self._snapshotted = action == "park"
            self.resolve(pb.CallbackResult(call_id=result.command_id, bytes=self.bytes_per_gpu))
        else:
            error = result.error or f"the workload could not {action}"
            self.resolve(pb.CallbackResult(call_id=result.command_id, error=error))

    def end(self, error: str = "") -> None:
        """Close the stream (replaced by a new registration, or a protocol error)."""
        self.error = self.error or error
        self.commands.put_nowait(None)


class Channels:
    """The open WorkloadChannels, one per job."""

    def __init__(self, jobs: Jobs) -> None:
        self._jobs = jobs
        self._by_tenant: dict[str, ChannelSession] = {}

    def of(self, tenant_id: str) -> ChannelSession | None:
        """The job's open channel, if it has one."""
        return self._by_tenant.get(tenant_id)

    async def serve(
        self, requests: AsyncIterator[sa.WorkloadMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[sa.AgentCommand]:
        """Register the workload, then push its commands until the stream ends."""
        try:
            session = await self._register(requests, context)
        except AgentError as exc:
            await context.abort(status_code(exc), str(exc))
            return
        reader = asyncio.create_task(self._read(requests, session))
        try:
            while (command := await session.commands.get()) is not None:
                yield command
        finally:
            reader.cancel()
            self._close(session)
        if session.error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, session.error)

    async def _register(
        self, requests: AsyncIterator[sa.WorkloadMessage], context: grpc.aio.ServicerContext
    ) -> ChannelSession:
        first = await anext(requests, None)
        if first is None or first.WhichOneof("message") != "register":
            raise BadRequest("the first message on a WorkloadChannel must be a RegisterWorkload")
        reg = first.register
        if reg.capabilities.default_mode and reg.capabilities.default_mode not in _MODES:
            raise BadRequest("default_mode must be SUSPEND_MODE_OFFLOAD or SUSPEND_MODE_DISCARD")
        if reg.group:
            tenant = await self._jobs.join(reg.job_id, reg.group, context.peer())
        else:  # llm-d's register_workload names no group by default
            tenant = await self._jobs.join_known(reg.job_id, context.peer())
        caller = await self._jobs.caller(context.peer())
        service = self._jobs.service
        where = service.preparer.residency_of(tenant.tenant_id)
        session = ChannelSession(
            tenant.tenant_id,
            caller.pid if caller else 0,
            reg.capabilities,
            tenant.gpu_memory_mib * MIB,
            snapshotted=any(r == "parked" for r in where.values()),
        )
        old = self._by_tenant.get(tenant.tenant_id)
        self._by_tenant[tenant.tenant_id] = session
        service.sessions.open(session)
        service.session_opened(tenant.tenant_id, session.pid)
        if old is not None:
            old.end()
        log.info("llm-d workload %s registered (group %r)", reg.job_id, reg.group)
        return session

    async def _read(
        self, requests: AsyncIterator[sa.WorkloadMessage], session: ChannelSession
    ) -> None:
        try:
            async for message in requests:
                if message.WhichOneof("message") == "result":
                    session.answer(message.result)
                else:
                    session.end("a WorkloadChannel carries one RegisterWorkload, first")
                    return
        except grpc.aio.AioRpcError:  # the workload went away
            pass
        session.end()

    def _close(self, session: ChannelSession) -> None:
        if self._by_tenant.get(session.tenant_id) is session:
            del self._by_tenant[session.tenant_id]
        service = self._jobs.service
        last = service.sessions.close(session)
        if not self._jobs.anchored(session.tenant_id, session.pid):
            service.session_closed(session.tenant_id, session.pid, last)
        # else the process lives on as one of the job's sessions (it may register again): only
        # its stream ended, and it stays one of the job's processes
        self._jobs.seen(session.tenant_id)  # its idle time counts from its channel's close

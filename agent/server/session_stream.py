"""One tenant's session stream: requests in, replies, grants and callbacks out."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

from agent.core import eager, errors
from agent.node.tenants import Tenant
from agent.server import api_ops
from agent.server.service import LeaseService
from agent.server.sessions import Session
from baton._pb import agent_pb2 as pb

log = logging.getLogger(__name__)


class Link(Protocol):
    """Where a session's messages travel: the gRPC `Session` call, or a direct session."""

    async def read(self) -> Any:
        """The next `ClientMessage`; anything else (gRPC's EOF, None) when the client is done."""
        ...

    async def write(self, message: pb.AgentMessage) -> None: ...


class SessionStream:
    """Serves one open session until either side ends it.

    Without a `Session` it serves a direct call link: requests and their replies only.
    """

    def __init__(
        self,
        service: LeaseService,
        session: Session | None,
        link: Link,
        tenant: Callable[[], Tenant | None],
    ) -> None:
        self._service = service
        self._session = session
        self._link = link
        self._tenant = tenant
        self._requests: dict[int, asyncio.Task[None]] = {}
        self._lock = asyncio.Lock()

    async def serve(self, welcome: pb.AgentMessage) -> None:
        """Write the welcome, then pump the outbox while reading requests."""
        await self._write(welcome)
        reader = asyncio.create_task(self._read())
        try:
            if self._session is None:
                await reader
                return
            while (message := await self._session.outbox.get()) is not None:
                await self._write(message)
        finally:
            reader.cancel()
            for task in self._requests.values():
                task.cancel()

    async def _read(self) -> None:
        try:
            while True:
                message = await self._link.read()
                if not isinstance(message, pb.ClientMessage):  # the client closed its side
                    return
                if message.HasField("callback_result") and self._session is not None:
                    self._session.resolve(message.callback_result)
                elif message.HasField("request"):
                    await self._handle(message.request)
        finally:
            if self._session is not None:
                self._session.outbox.put_nowait(None)

    async def _handle(self, request: pb.Request) -> None:
        kind = request.WhichOneof("kind")
        if kind == "cancel":  # a pending acquire is answered once more: cancelled
            task = self._requests.pop(request.request_id, None)
            if task is not None:
                task.cancel()
                cancelled = pb.Reply(request_id=request.request_id)
                cancelled.error.CopyFrom(
                    api_ops.error_status(errors.Cancelled("the acquire was withdrawn"))
                )
                await self._write(pb.AgentMessage(reply=cancelled))
            return
        if kind == "acquire":  # runs at once; only a turn that must wait becomes a task
            _, _, rest = eager.start(self._acquire(request))
            if rest is not None:
                task = asyncio.create_task(_finish(rest))
                self._requests[request.request_id] = task
                task.add_done_callback(lambda _: self._requests.pop(request.request_id, None))
            return
        if kind == "release":
            await self._release(request)
            return
        reply = pb.Reply(request_id=request.request_id)
        try:
            tenant = self._current_tenant()
            if kind == "renew":
                reply.lease.CopyFrom(api_ops.renew(self._service, tenant, request.renew.lease_id))
            else:
                raise errors.AgentError(f"unknown request {kind!r}; upgrade the agent")
        except errors.AgentError as exc:
            reply.error.CopyFrom(api_ops.error_status(exc))
        if self._session is not None:  # behind what was pushed before: a revocation it found
            self._session.send(pb.AgentMessage(reply=reply))
            return
        await self._write(pb.AgentMessage(reply=reply))

    async def _release(self, request: pb.Request) -> None:
        """A yield. Its answer leaves in the step that ended the turn: where the yield started
        no turn, as soon as the end is on disk (the yielder usually asks again at once; the GPU
        may be kept for it); else behind the grant (a direct session's is written as it is
        made; a grantee on gRPC hears one step later). Held back a step, it would wait for
        everything else due then (timers, the save, the name of who is due next)."""
        answer = _EarlyReply(request, self._link)
        try:
            tenant = self._current_tenant()
            released = api_ops.release(
                self._service, tenant, request.release, answer.early("released")
            )
            answer.reply.released.CopyFrom(released)
        except errors.AgentError as exc:
            answer.reply.error.CopyFrom(api_ops.error_status(exc))
        if not answer.sent:
            await self._write(answer.message)

    async def _acquire(self, request: pb.Request) -> None:
        answer = _EarlyReply(request, self._link)  # the grant leaves in the step that made it
        try:
            tenant = self._current_tenant()
            lease = await api_ops.acquire(
                self._service, tenant, request.acquire, answer.early("lease")
            )
            answer.reply.lease.CopyFrom(lease)
        except errors.AgentError as exc:
            answer.reply.error.CopyFrom(api_ops.error_status(exc))
        if not answer.sent:
            await self._write(answer.message)

    async def _write(self, message: pb.AgentMessage) -> None:
        async with self._lock:
            await self._link.write(message)

    def _current_tenant(self) -> Tenant:
        tenant = self._tenant()
        if tenant is None:
            raise errors.TenantGone("this session's tenant is no longer known to the agent")
        return tenant


class _EarlyReply:
    """A request's reply, which a direct session may write in the step that made its content
    (`write_now`), before the request's handling returns; else it is written after."""

    def __init__(self, request: pb.Request, link: Link) -> None:
        self.message = pb.AgentMessage()
        self.reply = self.message.reply
        """The reply, inside the message that carries it (built in place: no copy to send)."""
        self.reply.request_id = request.request_id
        self._write_now: Callable[[pb.AgentMessage], bool] | None = getattr(link, "write_now", None)
        self.sent = False
        """Written already (by the callback `early` made)."""

    def early(self, field: str) -> Callable[[Any], None] | None:
        """A callback that puts its message in the reply's `field` and writes the reply at once;
        None where the link cannot write in the middle of a step."""
        write_now = self._write_now
        if write_now is None:
            return None

        def now(message: Any) -> None:
            getattr(self.reply, field).CopyFrom(message)
            self.sent = write_now(self.message)

        return now


async def _finish(rest: eager.Rest[None]) -> None:
    await rest

"""The agent's gRPC API: authenticates each call, forwards it to `LeaseService`, maps errors."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
from collections.abc import AsyncIterator, Callable

import grpc

from agent.core import errors
from agent.core import events as ev
from agent.node.identity import Peer, TokenRegistry, may_watch
from agent.node.tenants import POD, Tenant, in_container
from agent.server import api_ops
from agent.server.service import LeaseService
from agent.server.session_stream import Link, SessionStream
from agent.server.sessions import Session as TenantSession
from baton._pb import agent_pb2 as pb
from baton._pb import agent_pb2_grpc
from baton.contract.names import AGENT_SESSION_METADATA, AGENT_WATCH_METADATA

log = logging.getLogger(__name__)

_mapped = api_ops.aborting(api_ops.status_code)

WATCH_HANGUP_S = 2.0
"""How long a watch that was told the agent stops waits for its watcher to hang up before it
ends the stream itself (a watcher older than the `agent_stopping` event reads the status)."""


def agent_uid() -> int:
    """The agent's own UID (the user allowed to watch every tenant's events, with root)."""
    return os.getuid()


class AgentServicer(agent_pb2_grpc.AgentServicer):
    """One instance per agent."""

    def __init__(
        self,
        service: LeaseService,
        tokens: TokenRegistry,
        watch_token: str,
        local_tenants: bool = True,
        container_id_of: Callable[[int], str | None] = lambda pid: None,
    ) -> None:
        self._service = service
        self._tokens = tokens
        self._watch_token = watch_token
        """What `WatchEvents` callers must present (the agent writes it to a root-only file)."""
        self._local_tenants = local_tenants
        """Whether processes outside any pod may register (refused by default when serving pods)."""
        self._container_id_of = container_id_of
        self._watches_end = asyncio.Event()
        self._watches_end_why = ""
        self._watches_hangup_s = WATCH_HANGUP_S

    def _as_seen_by(self, tenant: Tenant | None, pid: int) -> Tenant | None:
        """A pod tenant as the process `pid` sees it: its own container's GPUs."""
        if tenant is None or tenant.source != POD or not tenant.container_gpus:
            return tenant
        return in_container(tenant, self._container_id_of(pid))

    def _current(self, tenant_id: str, pid: int) -> Callable[[], Tenant | None]:
        """The session's tenant as its process sees it, looked up afresh on every request."""
        container: list[str | None] = []

        def current() -> Tenant | None:
            tenant = self._service.tenants.tenants.get(tenant_id)
            if tenant is None or tenant.source != POD or not tenant.container_gpus:
                return tenant
            if not container:  # a process stays in its container: read its cgroup once
                container.append(self._container_id_of(pid))
            return in_container(tenant, container[0])

        return current

    def _peer(self, context: grpc.aio.ServicerContext) -> Peer:
        metadata = dict(context.invocation_metadata() or ())
        peer = self._tokens.get(metadata.get(AGENT_SESSION_METADATA))
        if peer is None:
            raise errors.Unauthenticated(
                "no valid session token: connect through the agent's handshake socket first "
                "(the client library does this)"
            )
        return peer

    def _tenant(self, context: grpc.aio.ServicerContext) -> tuple[Peer, Tenant]:
        peer = self._peer(context)
        bound = self._tokens.tenant_of(peer.token)
        if bound is not None:
            tenant = self._service.tenants.tenants.get(bound)
        else:
            tenant = self._service.tenants.find(peer.pid, peer.pod_uid, peer.uid)
        tenant = self._as_seen_by(tenant, peer.pid)
        if tenant is None:
            raise errors.NotRegistered(
                f"process {peer.pid} belongs to no tenant: outside Kubernetes call Register "
                "first; in a pod, the agent has not seen the pod (yet)"
            )
        return peer, tenant

    @_mapped
    async def Register(
        self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterResponse:
        tenant = await self.register_peer(self._peer(context), request)
        return pb.RegisterResponse(tenant=api_ops.tenant_to_pb(tenant))

    async def register_peer(self, peer: Peer, request: pb.RegisterRequest) -> Tenant:
        """The tenant `peer` belongs to: its pod's, or the one it registers outside Kubernetes."""
        pod_uid = peer.pod_uid  # as it connected: its PID may be another process's now
        if pod_uid:
            tenant = self._service.tenants.find(peer.pid, pod_uid)
            if tenant is None:
                raise errors.NotRegistered(
                    f"process {peer.pid} runs in pod {pod_uid}, which the agent has not seen "
                    "with Baton GPUs assigned (yet); check the pod's baton.dev/assigned-gpus"
                )
        elif not self._local_tenants:
            raise errors.Forbidden(
                f"process {peer.pid} (UID {peer.uid}) runs in no pod, and this agent serves "
                "pods: local tenants are refused unless it runs with --allow-local-tenants "
                "(BATON_AGENT_ALLOW_LOCAL_TENANTS)"
            )
        elif not request.name or not request.gpus:
            raise errors.RegistrationConflict(
                "outside Kubernetes a tenant registers with a name and its GPUs "
                "(BATON_TENANT_NAME, BATON_GPUS)"
            )
        else:
            tenant = await self._service.register(peer.pid, peer.uid, request)
        self._tokens.bind(peer.token, tenant.tenant_id)
        return self._as_seen_by(tenant, peer.pid) or tenant

    @_mapped
    async def Acquire(
        self, request: pb.AcquireRequest, context: grpc.aio.ServicerContext
    ) -> pb.Lease:
        request.restores_with_grant = False  # only a session's own requests may ask it
        return await api_ops.acquire(self._service, self._tenant(context)[1], request)

    @_mapped
    async def Yield(
        self, request: pb.YieldRequest, context: grpc.aio.ServicerContext
    ) -> pb.YieldResponse:
        return api_ops.release(self._service, self._tenant(context)[1], request)

    @_mapped
    async def Renew(self, request: pb.RenewRequest, context: grpc.aio.ServicerContext) -> pb.Lease:
        return api_ops.renew(self._service, self._tenant(context)[1], request.lease_id)

    @_mapped
    async def GetLease(
        self, request: pb.GetLeaseRequest, context: grpc.aio.ServicerContext
    ) -> pb.Lease:
        return api_ops.renew(self._service, self._tenant(context)[1], request.lease_id)

    async def Session(
        self, request_iterator: AsyncIterator[pb.ClientMessage], context: grpc.aio.ServicerContext
    ) -> None:
        try:
            peer, tenant = self._tenant(context)
        except errors.AgentError as exc:
            await context.abort(api_ops.status_code(exc), str(exc))
            return
        first = await context.read()
        hello = first.hello if isinstance(first, pb.ClientMessage) else pb.Hello()
        await self.run_session(peer, tenant, hello, context)

    async def run_session(self, peer: Peer, tenant: Tenant, hello: pb.Hello, link: Link) -> None:
        """Open the tenant's session, serve it over `link` until it ends, then close it."""
        session = TenantSession(
            tenant.tenant_id, peer.pid, peer.token, frozenset(hello.callbacks), hello.keeps_turns
        )
        self._tokens.attach(peer.token)
        self._service.sessions.open(session)
        self._service.session_opened(tenant.tenant_id, peer.pid)
        log.info("session opened: tenant %s pid %d", tenant.tenant_id, peer.pid)
        welcome = pb.AgentMessage(welcome=pb.Welcome(tenant=api_ops.tenant_to_pb(tenant)))
        tenant_id = tenant.tenant_id
        stream = SessionStream(self._service, session, link, self._current(tenant_id, peer.pid))
        try:
            await stream.serve(welcome)
        finally:
            last = self._service.sessions.close(session)
            self._tokens.revoke(peer.token)
            self._service.session_closed(tenant_id, peer.pid, last)
            log.info("session closed: tenant %s pid %d", tenant_id, peer.pid)

    def session_tenant(self, token: str, pid: int) -> Tenant:
        """The tenant of the open session `token`, for another connection of its process."""
        owner = self._tokens.get(token)
        tenant_id = self._tokens.tenant_of(token)
        if owner is None or tenant_id is None or owner.pid != pid:
            raise errors.Unauthenticated(
                f"process {pid} has no open session with that token: a call link joins a "
                "session its own process opened"
            )
        tenant = self._as_seen_by(self._service.tenants.tenants.get(tenant_id), pid)
        if tenant is None:
            raise errors.TenantGone(f"tenant {tenant_id} is no longer known")
        return tenant

    async def sessions_closed(self, timeout: float) -> None:
        """Return once every tenant session is closed, or after `timeout`: once the gRPC server
        has stopped, the streams it ended close in the loop's next steps, and one still open
        as the agent's process ends would be cancelled (grpc logs that as an error)."""
        tokens = self._tokens.attached()
        ended = [asyncio.ensure_future(self._tokens.ended(t).wait()) for t in tokens]
        if ended:
            _, pending = await asyncio.wait(ended, timeout=timeout)
            for wait in pending:
                wait.cancel()

    def session_ended(self, token: str) -> asyncio.Event:
        """Set when the session of `token` ends."""
        return self._tokens.ended(token)

    async def run_calls(self, tenant: Tenant, link: Link, pid: int) -> None:
        """Serve requests of process `pid` (no session of their own) over `link` until it ends."""
        welcome = pb.AgentMessage(welcome=pb.Welcome(tenant=api_ops.tenant_to_pb(tenant)))
        stream = SessionStream(self._service, None, link, self._current(tenant.tenant_id, pid))
        await stream.serve(welcome)

    async def WatchEvents(
        self, request: pb.WatchEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Event]:
        try:
            peer = self._peer(context)
            metadata = dict(context.invocation_metadata() or ())
            presented = str(metadata.get(AGENT_WATCH_METADATA, ""))
            if not hmac.compare_digest(presented.encode(), self._watch_token.encode()):
                raise errors.Forbidden(
                    "watching the agent's events needs its watch token (the file watch-token "
                    "in its state directory, readable by the agent's user only): "
                    "`baton events --state-dir DIR` sends it"
                )
            if not may_watch(peer.uid, agent_uid()):
                raise errors.Forbidden(
                    f"UID {peer.uid} may not watch the agent's events: they show every "
                    f"tenant's turns; run as UID {agent_uid()} (the agent's user) or root"
                )
        except errors.AgentError as exc:
            await context.abort(api_ops.status_code(exc), str(exc))
            return
        async with self._service.events.subscribe() as queue:
            yield pb.Event(kind=ev.WATCHING, at=self._service.state.clock())
            while (event := await self._next_event(queue)) is not None:
                if lost := self._service.events.lost(queue):  # those right after the last shown
                    await context.abort(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"this watch fell over {self._service.events.backlog} events behind and "
                        f"lost {lost} after the last one it showed; watch again",
                    )
                yield pb.Event(
                    kind=event.kind,
                    tenant_id=event.tenant_id,
                    gpus=event.gpus,
                    lease_id=event.lease_id,
                    fencing_tokens=dict(event.tokens),
                    at=event.at,
                    detail=event.detail,
                )
            # The reason goes as an event, ahead of the stream's end: a status sent as the
            # agent closes its connections can be lost to the watcher (its transport's error,
            # "Stream removed", comes first), an event it has read cannot.
            yield pb.Event(
                kind=ev.STOPPING, at=self._service.state.clock(), detail=self._watches_end_why
            )
        with contextlib.suppress(TimeoutError):  # a watcher that read it hangs up: cancelled
            await asyncio.wait_for(asyncio.Event().wait(), self._watches_hangup_s)
        await context.abort(grpc.StatusCode.UNAVAILABLE, self._watches_end_why)

    def end_watches(self, why: str, grace: float = 2 * WATCH_HANGUP_S) -> None:
        """End every WatchEvents stream, now and from now on, saying `why` (the agent stops):
        an open watch would otherwise hold the agent's stop for its whole `grace`. A watcher
        that reads on after the `agent_stopping` event gets the status within half of it
        (`WATCH_HANGUP_S` at most), before the stop cuts the stream."""
        self._watches_end_why = why
        self._watches_hangup_s = max(0.0, min(WATCH_HANGUP_S, grace / 2))
        self._watches_end.set()

    async def _next_event(self, queue: asyncio.Queue[ev.Event]) -> ev.Event | None:
        """The next event, or None once the watches end."""
        if self._watches_end.is_set():
            return None
        got = asyncio.ensure_future(queue.get())
        ended = asyncio.ensure_future(self._watches_end.wait())
        try:
            await asyncio.wait((got, ended), return_when=asyncio.FIRST_COMPLETED)
        finally:
            got.cancel()
            ended.cancel()
        return got.result() if got.done() and not got.cancelled() else None

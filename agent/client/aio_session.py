"""The asyncio client's session: its reads and writes, reconnects, callbacks and renewals.

One task on the caller's event loop reads what the agent sends on the session (answers to
requests, turns given back, revocations, park/restore callbacks) and reconnects after the agent
restarts; timers on the loop renew the held turn and give a kept turn back. What each of those
does to the turn is decided in `agent.client.session_core`, as for the blocking client;
`agent.client.aio.AsyncBaton` adds the two calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Sequence
from typing import Any

from agent.client.aio_withdrawal import withdrawal
from agent.client.backstop import KeptBackstop
from agent.client.callback_runner import CLOSE_WAIT_S
from agent.client.connect import connected, lost_error, open_session, reconnect, usable
from agent.client.errors import AgentUnavailable, BatonError, from_status
from agent.client.links import TRANSPORTS, SessionLink
from agent.client.owner import SessionOwner
from agent.client.parked import Moves, refused, settled
from agent.client.refusals import Refusals
from agent.client.session_core import SessionCore
from agent.client.timers import LoopTimer
from agent.client.types import (
    Callback,
    Identity,
    LeaseInfo,
    add_callbacks,
    reply_wait,
    time_left,
    timings_of,
)
from baton._pb import agent_pb2 as pb

log = logging.getLogger("baton.client")


class _NotSent(Exception):
    """The session broke before a request left: it may be sent again after the reconnect."""


class AsyncSession:
    """A tenant's session with the node agent, served on the caller's event loop."""

    def __init__(
        self,
        socket: str | None = None,
        gpus: Sequence[str] | str | None = None,
        *,
        name: str | None = None,
        gpu_memory_mib: int = 0,
        gpu_duty: int = 0,
        memory_limit_bytes: int = 0,
        priority: int = 0,
        on_park: Callback | None = None,
        on_restore: Callback | None = None,
        connect_timeout: float = 5.0,
        renew_interval: float = 2.0,
        reconnect: bool = True,
        job: str = "",
        park_at_yield: bool = True,
        keep_turns: bool = True,
        transport: str = "direct",
    ) -> None:
        if transport not in TRANSPORTS:
            raise BatonError(f"unknown transport {transport!r}: use one of {', '.join(TRANSPORTS)}")
        self.transport = transport
        """How the session travels: "direct" (frames on the handshake socket) or "grpc"."""
        me = Identity.of(socket, gpus, name, gpu_memory_mib, gpu_duty, memory_limit_bytes, priority)
        self.socket, self.gpus, self.name = me.socket, me.gpus, me.name
        self.job = job
        """The job whose turn `acquire` takes across its nodes ("": the pod's own, if any)."""
        self._registration = me.registration
        self._callbacks: dict[str, Callback] = {}
        self._link: SessionLink | None = None
        self._token = ""
        add_callbacks(self._callbacks, False, on_park, on_restore)
        self._connect_timeout, renew = timings_of(connect_timeout, renew_interval)
        self.tenant: pb.Tenant | None = None
        """This tenant as the agent knows it (after connecting)."""
        self._core, self._reconnect = SessionCore(renew), reconnect
        self._core.park_at_yield = park_at_yield
        self._core.keeps_turns = keep_turns and not job  # a job's turn is the coordinator's
        self._write_lock: asyncio.Lock | None = None
        self._connected: asyncio.Event | None = None
        self._answered: asyncio.Event | None = None
        """Set while the session is open or the agent refuses it for good: what calls wait for."""
        self._refusals = Refusals(self.socket)
        """What the agent answered the reconnects since the session broke."""
        self._supervisor: asyncio.Task[None] | None = None
        self._opening: asyncio.Task[None] | None = None  # the first `connect`, all calls' own
        self._renewer = LoopTimer(self._renew_due, self._core.clock)
        self._keeper = LoopTimer(self._give_back_due, self._core.clock)
        self._kept_lock = threading.Lock()
        """Guards the core's kept lease, which the backstop's thread may give back."""
        self._backstop = KeptBackstop(
            self._core, self._kept_lock, self.socket, lambda: self._token, self._send_undelivered
        )
        self._kept_yield: asyncio.Task[None] | None = None
        self._withdrawal: asyncio.Task[None] | None = None  # of an acquire given up on
        self._closing = False
        self._owner = SessionOwner()
        self._tasks: set[asyncio.Task[None]] = set()
        self._moving: set[asyncio.Task[None]] = set()  # callbacks run for the agent
        self._replies: dict[int, asyncio.Future[pb.Reply]] = {}
        self._moves = Moves(self._callbacks)
        self.parked = self._moves.parked
        self._core.parked = self.parked.copy

    # Connection.

    async def connect(self) -> None:
        """Open the session (done by the first `acquire` if not called)."""
        opening = self._opening if self._opening is not None and not self._opening.done() else None
        usable(self._closing, self._supervisor or opening)
        if self._supervisor is not None:
            return
        if opening is None:  # one session for every call made meanwhile, each one waiting
            opening = self._opening = asyncio.create_task(self._open_first())
            opening.add_done_callback(lambda task: task.cancelled() or task.exception())
        try:
            await asyncio.shield(opening)  # (a caller cancelled leaves it to the others)
        except asyncio.CancelledError:  # close() cut it short: its callers' error is "closed"
            task = asyncio.current_task()
            if opening.cancelled() and self._closing and task and not task.cancelling():
                usable(self._closing, None)
            raise

    async def _open_first(self) -> None:
        self._connected, self._answered = asyncio.Event(), asyncio.Event()
        self._write_lock = asyncio.Lock()
        await self._open()
        self._owner.opened()
        self._supervisor = asyncio.create_task(self._supervise())

    async def _open(self) -> None:
        opened = await open_session(
            self.socket,
            self._registration,
            list(self._callbacks),
            self._connect_timeout,
            self.transport,
            self._core.keeps_turns,
        )
        if self._link is not None:
            await self._link.close()
        self._link, self._token = opened.link, opened.token
        self.tenant = opened.tenant
        assert self._connected is not None and self._answered is not None
        self._refusals.welcomed()
        self._connected.set()
        self._answered.set()

    async def _supervise(self) -> None:
        while not self._closing:
            assert self._link is not None
            await self._serve_session(self._link)
            if self._closing or not self._reconnect:
                return
            log.warning("lost the Baton agent at %s; reconnecting", self.socket)
            if await reconnect(self._open, lambda: self._closing, self.socket, self._heard):
                self._spawn(self._reclaim())

    def _heard(self, exc: BatonError) -> None:
        """A reconnect failed: calls waiting for it fail at once if the agent refused for good."""
        assert self._answered is not None
        if self._refusals.heard(exc):  # for good: calls waiting fail now
            self._answered.set()
        else:
            self._answered.clear()

    async def _serve_session(self, link: SessionLink) -> None:
        try:
            while (message := await link.read()) is not None:
                self._on_message(message)
        finally:
            self._lost(link)
            lost = lost_error(self._closing, self.socket)  # (cancelled: its loop ends)
            for future in self._replies.values():
                if not future.done():
                    future.set_exception(lost)

    def _on_message(self, message: pb.AgentMessage) -> None:
        kind = message.WhichOneof("kind")
        if kind == "reply":
            self._on_reply(message.reply)
        elif kind == "callback":  # (close() lets one in flight finish and answers it)
            self._moving.add(task := self._spawn(self._run_callback(message.callback)))
            task.add_done_callback(self._moving.discard)
        else:
            with self._kept_lock:
                release = self._core.pushed(message)
            self._yield_kept(release)
            self._rearm()

    def _on_reply(self, reply: pb.Reply) -> None:
        future = self._replies.pop(reply.request_id, None)
        if future is not None and not future.done():
            future.set_result(reply)
            return
        if (release := self._core.unclaimed(reply)) is not None:
            self._spawn(self._send(pb.ClientMessage(request=release)))

    async def _run_callback(self, request: pb.Callback) -> None:
        result = refused(request) if self._closing else await self._moves.move(request)
        with contextlib.suppress(AgentUnavailable):
            await self._send(pb.ClientMessage(callback_result=result))

    async def _send(self, message: pb.ClientMessage) -> None:
        assert self._write_lock is not None and self._link is not None
        link = self._link
        try:
            async with self._write_lock:
                await link.write(message)
        except AgentUnavailable:
            self._lost(link)
            raise

    def _lost(self, link: SessionLink) -> None:
        """The session `link` is broken: calls wait for the reconnect from now on. A forked
        child's copy (its task cancelled as it leaves `asyncio.run`) leaves the link alone:
        closing it would take the socket off the event loop's epoll, which the parent shares."""
        if link is self._link and self._connected is not None and not self._owner.forked():
            self._connected.clear()
            if self._answered is not None:
                self._answered.clear()
            link.cancel()  # so that the read side ends too, and the supervisor reconnects

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _request(
        self, request: pb.Request, timeout: float | None = None, slack: float = 0.0
    ) -> pb.Reply:
        """Send a request on the session and wait up to `timeout` + `slack` for its reply.

        While the session is broken the request waits for the reconnect, up to `timeout` (or
        the connect timeout), and goes out with what is left of `timeout`; a stream that breaks
        after it was sent fails it. Only an acquire without a timeout waits for its reply
        without end (it is queued); the others are answered at once by a live agent and give up
        after `REPLY_TIMEOUT_S`.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self._connect_timeout if timeout is None else timeout)
        while True:
            await self._ready(deadline - loop.time())
            left = None if timeout is None else max(0.0, deadline - loop.time())
            reply_timeout = reply_wait(time_left(request, left), left, slack)
            try:
                return await self._send_request(request, reply_timeout)
            except _NotSent:
                continue

    async def _send_request(self, request: pb.Request, timeout: float | None) -> pb.Reply:
        request.request_id = next(self._core.ids)
        future: asyncio.Future[pb.Reply] = asyncio.get_running_loop().create_future()
        self._replies[request.request_id] = future
        sent = False
        try:
            try:
                await self._send(pb.ClientMessage(request=request))
            except AgentUnavailable:
                raise _NotSent from None
            sent = True
            reply = await asyncio.wait_for(future, timeout)
        except (asyncio.CancelledError, TimeoutError) as exc:
            kind = request.WhichOneof("kind")
            if kind == "acquire":  # it leaves the queue; the next acquire waits for that
                rid = request.request_id
                gone = withdrawal(
                    self._replies, rid, future, sent, self._send, self._core.unclaimed
                )
                self._withdrawal = self._spawn(gone)
            if isinstance(exc, TimeoutError):
                raise AgentUnavailable(
                    f"the Baton agent at {self.socket} did not answer a {kind} request "
                    f"within {timeout:.3g} s"
                ) from None
            raise
        finally:
            if self._replies.get(request.request_id) is future:  # (else: the withdrawal's)
                del self._replies[request.request_id]
        if reply.HasField("error"):
            raise from_status(reply.error.code, reply.error.message, self.socket)
        return reply

    async def _reclaim(self) -> None:
        """After a reconnect: tell the new agent that the turn held is still in use."""
        with self._kept_lock:
            lease = self._core.reclaim()
            release = self._core.give_back()
        self._yield_kept(release)
        self._rearm()
        if lease is not None:
            await self._renew_once(lease, reclaiming=True)

    async def _ready(self, wait: float) -> None:
        """Return once the session is open; `AgentUnavailable` if not within `wait` seconds."""
        await self.connect()
        assert self._connected is not None and self._answered is not None
        assert self._supervisor is not None
        reconnecting = self._reconnect and not self._supervisor.done()
        await connected(
            self._connected, self._answered, self._refusals, reconnecting, wait, self.socket,
            closing=lambda: self._closing,
        )  # fmt: skip

    # Renewal.

    def _rearm(self) -> None:
        """Set the renewal and kept-turn timers to the core's deadlines (or stop them)."""
        self._renewer.set(self._core.renew_at)
        self._keeper.set(self._core.kept_deadline())

    def _renew_due(self) -> None:
        lease = self._core.renewal_due()
        if lease is not None:
            self._spawn(self._renew_once(lease))
        elif self._core.renew_at is not None:  # the timer fired a hair early
            self._rearm()

    async def _renew_once(self, lease: LeaseInfo, reclaiming: bool = False) -> None:
        outcome: LeaseInfo | BatonError
        try:
            outcome = await self._renew(lease.lease_id)
        except BatonError as exc:
            outcome = exc
        self._core.renewed(lease, outcome, reclaiming)
        self._rearm()

    async def _renew(self, lease_id: str) -> LeaseInfo:
        reply = await self._request(pb.Request(renew=pb.RenewRequest(lease_id=lease_id)))
        return LeaseInfo.from_pb(reply.lease)

    # Kept turns (`agent.server.kept_turns`).

    def _give_back_due(self) -> None:
        with self._kept_lock:
            release = self._core.kept_due()
        self._yield_kept(release)
        self._rearm()

    def _send_undelivered(self) -> None:
        """The backstop's thread could not give the kept lease back: the loop sends it."""
        with self._kept_lock:
            release = self._core.give_back() if self._core.kept is None else None
        self._yield_kept(release)

    def _yield_kept(self, release: pb.Request | None) -> None:
        """Yield a kept lease to the agent (its answer is only logged: `_on_reply`); an
        `acquire` waits for the write (`_kept_yield`), so the agent reads the yield first."""
        if release is not None:
            self._kept_yield = self._spawn(self._send_kept(release))

    async def _send_kept(self, release: pb.Request) -> None:
        try:
            await self._send(pb.ClientMessage(request=release))
        except AgentUnavailable:  # the session is down: sent again after it is up (`_reclaim`)
            with self._kept_lock:
                self._core.undelivered = release

    # Lifecycle.

    async def close(self) -> None:
        """End the session; the agent releases this process's turn and queue places."""
        self._closing = True
        if self._owner.forked():  # a forked child's copy: the parent's session goes on
            return
        self._renewer.set(None)
        self._keeper.set(None)
        if self._answered is not None:  # calls waiting for a reconnect hear "closed" now
            self._answered.set()
        if self._opening is not None and self._opening.cancel():  # (a connect under way)
            await asyncio.wait([self._opening])
        await settled(self._moves, self._moving, CLOSE_WAIT_S)  # (none if inside one)
        if self._backstop.started:  # (it may be waiting for the answer to a yield it sent)
            await asyncio.to_thread(self._backstop.close)
        if self._link is not None:
            self._link.cancel()
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._link is not None:
            await self._link.close()

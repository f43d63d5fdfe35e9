"""The blocking client's session: its reader thread, reconnects, callbacks and renewals.

One background thread per client reads what the agent sends on the session (answers to
background requests, turns given back, revocations, park/restore callbacks), renews the held
turn and reconnects after the agent restarts; what each of those does to the turn is decided in
`agent.client.session_core`. `agent.client.sync.Baton` adds the two calls.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import socket as socketlib
import threading
import time
import weakref
from collections.abc import Callable, Sequence

from agent.client.background import BackgroundCall
from agent.client.call_link import CallLink
from agent.client.callback_runner import CLOSE_WAIT_S, CallbackRunner, CallbackTiming
from agent.client.connect import CLIENT_VERSION
from agent.client.errors import AgentUnavailable, BatonError, from_status
from agent.client.owner import SessionOwner
from agent.client.session_core import SessionCore
from agent.client.timers import Keeper
from agent.client.types import Callback, Identity, LeaseInfo, add_callbacks, timings_of
from agent.wire.handshake import handshake_path, read_token_line
from baton._pb import agent_pb2 as pb
from baton.contract import framing
from baton.contract.names import ENV_AGENT_SOCKET

log = logging.getLogger("baton.client")

RECONNECT_BACKOFF_S = (0.05, 2.0)
"""First and longest pause between reconnect attempts."""


class BlockingSession:
    """A tenant's session with the node agent, served by a background thread."""

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
    ) -> None:
        me = Identity.of(socket, gpus, name, gpu_memory_mib, gpu_duty, memory_limit_bytes, priority)
        self.socket, self.gpus, self.name = me.socket, me.gpus, me.name
        self.job = job
        """The job whose turn `acquire` takes across its nodes ("": the pod's own, if any)."""
        self._registration = me.registration
        self._callbacks: dict[str, Callback] = {}
        self._connect_timeout, self._renew_interval = timings_of(connect_timeout, renew_interval)
        self._reconnect = reconnect
        self.tenant: pb.Tenant | None = None
        """This tenant as the agent knows it (after connecting)."""
        self._core = SessionCore(self._renew_interval)
        self._core.park_at_yield = park_at_yield
        """The turn held and its renewal; changed only under `_state`."""
        self._core.keeps_turns = keep_turns and not job  # a job's turn is the coordinator's
        self._keeper = Keeper(self._kept_deadline, self._give_back_due, self._core.clock)
        self._kept_released = threading.Event()
        """Clear while the yield of a kept lease travels on the session (`_yield_kept`)."""
        self._kept_released.set()
        self._token = ""
        self._sock: socketlib.socket | None = None
        self._connected = threading.Event()
        self._disconnected = threading.Event()
        """Set while the session is broken (the opposite of `_connected`, to wait on)."""
        self._closed = threading.Event()
        self._owner = SessionOwner()
        self._connect_lock, self._send_lock = threading.Lock(), threading.Lock()
        self._call_lock = threading.Lock()
        """One request at a time on the call link; calls from several threads queue here."""
        self._acquiring = threading.Lock()
        """One acquire at a time: one made while another thread's waits takes the same grant."""
        self._link: CallLink | None = None
        self._state = threading.RLock()
        """Guards the core, the calls and the socket, shared by the caller and the reader."""
        self._calls: dict[int, BackgroundCall] = {}
        self._reader: threading.Thread | None = None
        self._callbacks_run = CallbackRunner(self._callbacks, self._answer)
        """Runs park/restore callbacks (on the reader thread; a restore a grant owes on the
        acquiring thread); closing waits for the one in flight."""
        self._core.parked = self._callbacks_run.parked.copy
        self.close_wait = CLOSE_WAIT_S
        """How long `close()` waits for a park or restore in flight."""
        self._at_exit = functools.partial(_close_at_exit, weakref.ref(self))
        self.register_callbacks(on_park=on_park, on_restore=on_restore)

    @property
    def lease(self) -> LeaseInfo | None:
        """The turn held now, if any."""
        return self._core.lease

    @property
    def callback_timings(self) -> list[CallbackTiming]:
        """When the latest park/restore callbacks were read, ran and were answered."""
        return list(self._callbacks_run.timings)

    @property
    def resuming(self) -> bool:
        """True after a revocation, until the agent hands the turn back."""
        return self._core.resuming

    def register_callbacks(
        self, on_park: Callback | None = None, on_restore: Callback | None = None
    ) -> None:
        """Callbacks the agent may ask for: move this tenant's memory off / back onto a GPU.

        Each gets the GPU UUID and returns the bytes it moved. Register before connecting.
        """
        add_callbacks(self._callbacks, self._reader is not None, on_park, on_restore)

    # Connection.

    def connect(self) -> None:
        """Open the session now (the first `acquire` does it otherwise)."""
        with self._connect_lock:
            if self._closed.is_set():
                raise BatonError("this Baton client is closed; create a new one")
            if self._reader is not None:
                return
            reader = self._open()
            self._owner.opened()
            atexit.register(self._at_exit)
            self._reader = threading.Thread(
                target=self._supervise, args=(reader,), name="baton-client", daemon=True
            )
            self._reader.start()

    def _open(self) -> framing.BlockingReader:
        """Handshake, Hello, Welcome: a new session is current; `AgentUnavailable` if not."""
        sock = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
        sock.settimeout(self._connect_timeout)
        try:
            sock.connect(handshake_path(self.socket))
            token, rest = read_token_line(sock)
            hello = pb.Hello(
                client_version=CLIENT_VERSION,
                callbacks=sorted(self._callbacks),
                register=self._registration,
                keeps_turns=self._core.keeps_turns,
            )
            sock.sendall(framing.encode(pb.ClientMessage(hello=hello)))
            reader = framing.BlockingReader(sock, rest)
            first = reader.read(pb.AgentMessage)
        except (OSError, ValueError, KeyError, framing.FrameError) as exc:
            sock.close()
            raise AgentUnavailable(
                f"cannot reach the Baton agent at {self.socket} ({exc}); is `baton agent` "
                f"running, and is {ENV_AGENT_SOCKET} right?"
            ) from None
        if first is None or not first.HasField("welcome"):
            sock.close()
            if first is not None and first.HasField("refused"):
                raise from_status(first.refused.code, first.refused.message, self.socket)
            raise AgentUnavailable(f"the Baton agent at {self.socket} closed the session")
        sock.settimeout(max(0.01, min(1.0, self._renew_interval / 2)))  # looks up to renew
        with self._state:
            self._sock, self._token, self.tenant = sock, token, first.welcome.tenant
            self._disconnected.clear()
        self._connected.set()
        return reader

    def _supervise(self, reader: framing.BlockingReader) -> None:
        """The reader thread: serve the session; after it breaks, reconnect and serve again."""
        while True:
            self._serve(reader)
            if self._closed.is_set() or not self._reconnect:
                return
            log.warning("lost the Baton agent at %s; reconnecting", self.socket)
            opened = self._reopen()
            if opened is None:
                return
            reader = opened
            log.warning("reconnected to the Baton agent at %s", self.socket)
            self._reclaim()

    def _reopen(self) -> framing.BlockingReader | None:
        delay, longest = RECONNECT_BACKOFF_S
        while not self._closed.is_set():
            try:
                return self._open()
            except BatonError as exc:
                log.warning("reconnect failed (%s); retrying in %.2f s", exc, delay)
                if self._closed.wait(delay):
                    return None
                delay = min(longest, delay * 2)
        return None

    def _serve(self, reader: framing.BlockingReader) -> None:
        sock = self._sock
        try:
            while True:
                try:
                    message = reader.read(pb.AgentMessage)
                except TimeoutError:
                    self._renew_if_due()
                    continue
                if message is None:
                    return
                self._on_message(message)
                self._renew_if_due()
        except (OSError, framing.FrameError) as exc:
            if not self._closed.is_set():
                log.info("session with the Baton agent at %s ended: %s", self.socket, exc)
        finally:
            if sock is not None:
                self._lost(sock)

    def _lost(self, sock: socketlib.socket) -> None:
        """The session on `sock` is broken: calls wait for the reconnect from now on."""
        with self._state:
            if sock is not self._sock:
                return
            self._connected.clear()
            self._disconnected.set()
            self._sock = None
            calls, self._calls = self._calls, {}
            link, self._link = self._link, None
        if link is not None:
            link.close()  # a caller waiting on it hears of the loss at once
        with contextlib.suppress(OSError):
            sock.shutdown(socketlib.SHUT_RDWR)
        sock.close()
        lost = AgentUnavailable(
            f"lost the Baton agent at {self.socket}; reconnecting, retry the call"
        )
        for call in calls.values():
            call.finish(None, lost)

    def _ready(self, wait: float) -> None:
        """Return once the session is open; `AgentUnavailable` if not within `wait` seconds."""
        if self._reader is None:
            self.connect()
        if self._connected.is_set():
            return
        assert self._reader is not None
        if self._closed.is_set():
            raise BatonError("this Baton client is closed; create a new one")
        if not self._reconnect or not self._reader.is_alive():
            raise AgentUnavailable(
                f"lost the Baton agent at {self.socket} and this client does not reconnect "
                "(reconnect=False); create a new client"
            )
        if not self._connected.wait(max(0.0, wait)):
            raise AgentUnavailable(
                f"not connected to the Baton agent at {self.socket}: still reconnecting "
                f"after {max(0.0, wait):.3g} s"
            )

    # Messages.

    def _on_message(self, message: pb.AgentMessage) -> None:
        kind = message.WhichOneof("kind")
        if kind == "reply":
            self._on_reply(message.reply)
        elif kind == "callback":
            self._callbacks_run.run(message.callback, time.time())
        else:
            with self._state:
                self._yield_kept(self._core.pushed(message))

    def _on_reply(self, reply: pb.Reply) -> None:
        with self._state:
            call = self._calls.pop(reply.request_id, None)
        if call is not None:
            call.finish(reply)
            return
        release = self._core.unclaimed(reply)
        if release is not None:
            with contextlib.suppress(AgentUnavailable):
                self._send(pb.ClientMessage(request=release))

    def _answer(self, result: pb.CallbackResult) -> None:
        with contextlib.suppress(AgentUnavailable):
            self._send(pb.ClientMessage(callback_result=result))

    def _send(self, message: pb.ClientMessage) -> None:
        frame = framing.encode(message)
        with self._state:
            sock = self._sock
        if sock is None:
            raise AgentUnavailable(f"not connected to the Baton agent at {self.socket}")
        try:
            with self._send_lock:
                sock.sendall(frame)
        except OSError as exc:
            self._lost(sock)
            raise AgentUnavailable(f"lost the Baton agent at {self.socket}: {exc}") from None

    def _background(self, request: pb.Request, on_done: Callable[[BackgroundCall], None]) -> None:
        """Send a request whose answer `on_done` handles on the reader thread."""
        call = BackgroundCall(on_done)
        request.request_id = next(self._core.ids)
        with self._state:
            self._calls[request.request_id] = call
        try:
            self._send(pb.ClientMessage(request=request))
        except AgentUnavailable as exc:
            with self._state:
                self._calls.pop(request.request_id, None)
            call.finish(None, exc)

    # Renewal (on the reader thread).

    def _renew_if_due(self) -> None:
        with self._state:
            lease = self._core.renewal_due()
        if lease is not None:
            self._renew(lease, reclaiming=False)

    def _reclaim(self) -> None:
        """After a reconnect: tell the new agent that the turn held is still in use."""
        with self._state:
            lease = self._core.reclaim()
            self._yield_kept(self._core.give_back())
        if lease is not None:
            self._renew(lease, reclaiming=True)

    # Kept turns (`agent.server.kept_turns`).

    def _kept_deadline(self) -> float | None:
        with self._state:
            return self._core.kept_deadline()

    def _give_back_due(self) -> None:
        with self._state:
            self._yield_kept(self._core.kept_due())

    def _yield_kept(self, release: pb.Request | None) -> None:
        """Yield a kept lease to the agent on the session, under `_state` (as the core gave it
        up): an `acquire` that finds nothing kept waits for its answer before it asks on the
        call link, another connection, which the agent might read first."""
        if release is None:
            return

        def done(call: BackgroundCall) -> None:
            if isinstance(call.error, AgentUnavailable):  # the session is down: after it is up
                with self._state:
                    self._core.undelivered = release
            self._kept_released.set()

        self._kept_released.clear()
        self._background(release, done)

    def _renew(self, lease: LeaseInfo, reclaiming: bool) -> None:
        def done(call: BackgroundCall) -> None:
            outcome: LeaseInfo | BatonError
            try:
                outcome = LeaseInfo.from_pb(call.result(self.socket).lease)
            except BatonError as exc:
                outcome = exc
            with self._state:
                self._core.renewed(lease, outcome, reclaiming)

        self._background(pb.Request(renew=pb.RenewRequest(lease_id=lease.lease_id)), done)

    def close(self) -> None:
        """End the session; the agent releases this process's turn and queue places.

        A park or restore in flight finishes (and is answered) first, up to `close_wait`
        seconds; callbacks asked for after this are refused. Runs at interpreter exit too.
        """
        self._closed.set()
        atexit.unregister(self._at_exit)
        if self._owner.forked():  # a forked child's copy: the parent's session goes on
            return
        self._keeper.close()
        self._callbacks_run.close(self.close_wait)
        with self._state:
            sock = self._sock
        if sock is not None:
            self._lost(sock)
        reader = self._reader
        if reader is not None and reader is not threading.current_thread():
            reader.join(timeout=5)


def _close_at_exit(session: weakref.ref[BlockingSession]) -> None:
    """Close a session the program left open, so no callback runs while the interpreter ends."""
    if (live := session()) is not None:
        live.close()

"""The blocking client's connection to the agent: the session's socket and the thread that reads it.

The reader thread (`_supervise`, started by `agent.client.blocking_session.BlockingSession`)
serves the session until it breaks, then reconnects; requests whose answers it handles are sent
on the session too (`_background`). What the session says and what its messages do to the turn
are the session's (`_hello`, `_on_message`, `_renew_if_due`, `_reclaim`).
"""

from __future__ import annotations

import contextlib
import logging
import socket as socketlib
import threading
from collections.abc import Callable, Iterator

from agent.client.background import BackgroundCall
from agent.client.call_link import CallLink
from agent.client.errors import AgentUnavailable, BatonError, from_status
from agent.client.refusals import Refusals
from agent.wire.handshake import handshake_path, read_token_line
from baton._pb import agent_pb2 as pb
from baton.contract import framing
from baton.contract.names import ENV_AGENT_SOCKET

log = logging.getLogger("baton.client")

RECONNECT_BACKOFF_S = (0.05, 2.0)
"""First and longest pause between reconnect attempts."""


class BlockingConnection:
    """The socket of a tenant's session with the node agent, read by a background thread."""

    def __init__(
        self,
        socket: str,
        connect_timeout: float,
        renew_interval: float,
        reconnect: bool,
        ids: Iterator[int],
    ) -> None:
        self.socket = socket
        self._connect_timeout, self._renew_interval = connect_timeout, renew_interval
        self._reconnect = reconnect
        self._ids = ids
        """Request ids, shared with the call link (`SessionCore.ids`)."""
        self.tenant: pb.Tenant | None = None
        """This tenant as the agent knows it (after connecting)."""
        self._token = ""
        self._sock: socketlib.socket | None = None
        self._connected = threading.Event()
        self._disconnected = threading.Event()
        """Set while the session is broken (the opposite of `_connected`, to wait on)."""
        self._answered = threading.Event()
        """Set while the session is open or the agent refuses it for good: what calls wait for."""
        self._refusals = Refusals(socket)
        """What the agent answered the reconnects since the session broke (under `_state`)."""
        self._closed = threading.Event()
        self._send_lock = threading.Lock()
        self._call_lock = threading.Lock()
        """One request at a time on the call link; calls from several threads queue here."""
        self._link: CallLink | None = None
        self._state = threading.RLock()
        """Guards the core, the calls and the socket, shared by the caller and the reader."""
        self._calls: dict[int, BackgroundCall] = {}

    # What the session adds.

    def _hello(self) -> pb.Hello:
        """The Hello that opens each session."""
        raise NotImplementedError

    def _on_message(self, message: pb.AgentMessage) -> None:
        """A message the agent sent on the session (on the reader thread)."""
        raise NotImplementedError

    def _renew_if_due(self) -> None:
        """Between reads (on the reader thread): renew the turn held if its renewal is due."""
        raise NotImplementedError

    def _reclaim(self) -> None:
        """After a reconnect (on the reader thread)."""
        raise NotImplementedError

    # Opening, serving and reconnecting.

    def _open(self) -> framing.BlockingReader:
        """Handshake, Hello, Welcome: a new session is current; `AgentUnavailable` if not."""
        sock = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
        sock.settimeout(self._connect_timeout)
        try:
            sock.connect(handshake_path(self.socket))
            token, rest = read_token_line(sock)
            hello = self._hello()
            sock.sendall(framing.encode(pb.ClientMessage(hello=hello)))
            reader = framing.BlockingReader(sock, rest)
            first = reader.read(pb.AgentMessage)
        except (OSError, ValueError, framing.FrameError) as exc:
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
            self._refusals.welcomed()
            self._connected.set()
            self._answered.set()
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
                self._heard(exc)
                log.warning("reconnect failed (%s); retrying in %.2f s", exc, delay)
                if self._closed.wait(delay):
                    return None
                delay = min(longest, delay * 2)
        return None

    def _heard(self, exc: BatonError) -> None:
        """A reconnect failed: calls waiting for it fail at once if the agent refused for good."""
        with self._state:
            if self._refusals.heard(exc):  # for good: calls waiting fail now
                self._answered.set()
            else:
                self._answered.clear()

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
            self._answered.clear()
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

    # Sending on the session.

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
        request.request_id = next(self._ids)
        with self._state:
            self._calls[request.request_id] = call
        try:
            self._send(pb.ClientMessage(request=request))
        except AgentUnavailable as exc:
            with self._state:
                self._calls.pop(request.request_id, None)
            call.finish(None, exc)

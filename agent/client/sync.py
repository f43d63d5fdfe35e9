"""`Baton`: the blocking client, on a direct session with the node agent.

The caller's thread writes its requests straight to the socket and waits for the answer; one
background thread per client reads what the agent sends (answers, turns given back, revocations,
park/restore callbacks), renews the held turn and reconnects after the agent restarts. No event
loop sits between the caller and the socket, so a turn costs two small writes and one wake-up.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket as socketlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from agent.client.connect import CLIENT_VERSION
from agent.client.errors import (
    AgentUnavailable,
    BatonError,
    LeaseLost,
    NotHolding,
    from_status,
)
from agent.client.types import (
    REPLY_TIMEOUT_S,
    Callback,
    Identity,
    LeaseInfo,
    add_callbacks,
    reply_wait,
    run_callback_blocking,
)
from agent.wire import framing
from agent.wire.handshake import handshake_path, read_token_line
from baton._pb import agent_pb2 as pb
from baton.names import ENV_AGENT_SOCKET

log = logging.getLogger("baton.client")

LINK_GRACE_S = 2.0
"""How long a call link that cannot reach the agent waits to see the session break too."""
RECONNECT_BACKOFF_S = (0.05, 2.0)
"""First and longest pause between reconnect attempts."""


class _NotSent(Exception):
    """The session broke before a request left: it may be sent again after the reconnect."""


class _Call:
    """A request on the session whose answer `on_done` handles on the reader thread."""

    def __init__(self, on_done: Callable[[_Call], None]) -> None:
        self.reply: pb.Reply | None = None
        self.error: BatonError | None = None
        self.on_done = on_done

    def finish(self, reply: pb.Reply | None, error: BatonError | None = None) -> None:
        self.reply, self.error = reply, error
        self.on_done(self)

    def result(self, socket: str) -> pb.Reply:
        """The reply, or the error it carries."""
        if self.error is not None:
            raise self.error
        assert self.reply is not None
        if self.reply.HasField("error"):
            raise from_status(self.reply.error.code, self.reply.error.message, socket)
        return self.reply


class _CallLink:
    """A connection that carries this client's requests; read by the thread that waits."""

    def __init__(self, sock: socketlib.socket, reader: framing.BlockingReader, token: str):
        self.sock = sock
        self.reader = reader
        self.token = token
        """The session this link belongs to."""

    @classmethod
    def open(cls, socket: str, token: str, timeout: float) -> _CallLink:
        sock = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(handshake_path(socket))
            _, rest = read_token_line(sock)
            hello = pb.Hello(client_version=CLIENT_VERSION, session_token=token)
            sock.sendall(framing.encode(pb.ClientMessage(hello=hello)))
            reader = framing.BlockingReader(sock, rest)
            first = reader.read(pb.AgentMessage)
            if first is None or not first.HasField("welcome"):
                why = first.refused.message if first is not None else "closed"
                raise OSError(f"the agent did not open a call link: {why}")
        except BaseException:
            sock.close()
            raise
        return cls(sock, reader, token)

    def send(self, message: pb.ClientMessage) -> None:
        self.sock.sendall(framing.encode(message))

    def read(self, timeout: float | None) -> pb.Reply | None:
        """The next reply; None at the end of the link; `TimeoutError` after `timeout`."""
        self.sock.settimeout(timeout)
        message = self.reader.read(pb.AgentMessage)
        if message is None:
            return None
        if not message.HasField("reply"):
            raise framing.FrameError(
                f"a call link carries replies, not {message.WhichOneof('kind')}"
            )
        return message.reply

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socketlib.SHUT_RDWR)
        self.sock.close()


class Baton:
    """Takes turns on this tenant's GPUs: `acquire()`, `yield_()`, `with baton.turn(): ...`.

    Arguments default to `BATON_AGENT_SOCKET`, `BATON_GPUS` and `BATON_TENANT_NAME`.
    """

    def __init__(
        self,
        socket: str | None = None,
        gpus: Sequence[str] | str | None = None,
        *,
        name: str | None = None,
        gpu_memory_mib: int = 0,
        gpu_duty: int = 0,
        memory_limit_bytes: int = 0,
        on_park: Callback | None = None,
        on_restore: Callback | None = None,
        connect_timeout: float = 5.0,
        renew_interval: float = 2.0,
        reconnect: bool = True,
    ) -> None:
        me = Identity.of(socket, gpus, name, gpu_memory_mib, gpu_duty, memory_limit_bytes)
        self.socket, self.gpus, self.name = me.socket, me.gpus, me.name
        self._registration = me.registration
        self._callbacks: dict[str, Callback] = {}
        self._connect_timeout = connect_timeout
        self._renew_interval = renew_interval
        self._reconnect = reconnect
        self.tenant: pb.Tenant | None = None
        """This tenant as the agent knows it (after connecting)."""
        self.lease: LeaseInfo | None = None
        """The turn held now, if any."""
        self.resuming = False
        """True after a revocation, until the agent hands the turn back."""
        self._token = ""
        self._sock: socketlib.socket | None = None
        self._connected = threading.Event()
        self._disconnected = threading.Event()
        """Set while the session is broken (the opposite of `_connected`, to wait on)."""
        self._closed = threading.Event()
        self._connect_lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._call_lock = threading.Lock()
        """One request at a time on the call link; calls from several threads queue here."""
        self._link: _CallLink | None = None
        self._state = threading.RLock()
        """Guards the lease, the calls and the socket, shared by the caller and the reader."""
        self._calls: dict[int, _Call] = {}
        self._ids = itertools.count(1)
        self._renew_at: float | None = None
        self._reader: threading.Thread | None = None
        self.register_callbacks(on_park=on_park, on_restore=on_restore)

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
        sock.settimeout(self._tick())
        with self._state:
            self._sock, self._token, self.tenant = sock, token, first.welcome.tenant
            self._disconnected.clear()
        self._connected.set()
        return reader

    def _tick(self) -> float:
        """How often the reader thread looks up from the socket to renew the turn."""
        return max(0.01, min(1.0, self._renew_interval / 2))

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
            threading.Thread(
                target=self._run_callback, args=(message.callback,), daemon=True
            ).start()
        elif kind == "granted":
            self._on_resumed(LeaseInfo.from_pb(message.granted))
        elif kind == "revoked":
            self._on_revoked(message.revoked)

    def _on_reply(self, reply: pb.Reply) -> None:
        with self._state:
            call = self._calls.pop(reply.request_id, None)
        if call is not None:
            call.finish(reply)
        else:  # acquires travel on the call link: nothing granted arrives unasked here
            log.debug("answer %d on the session matches no request", reply.request_id)

    def _on_revoked(self, revoked: pb.Revoked) -> None:
        with self._state:
            if self.lease is None or self.lease.lease_id != revoked.lease_id:
                log.info("turn %s revoked after this tenant yielded it", revoked.lease_id)
                return
            log.warning("turn revoked (%s); queued first for the next", revoked.reason)
            self.lease, self.resuming, self._renew_at = None, True, None

    def _on_resumed(self, lease: LeaseInfo) -> None:
        with self._state:
            if not self.resuming:  # yielded since the revocation: that yield ended this turn
                log.info("turn %s given back after this tenant yielded; not taken", lease.lease_id)
                return
            self.lease, self.resuming = lease, False
            self._renew_at = time.monotonic() + self._renew_interval
        log.info("turn given back after a revocation: %s", lease.lease_id)

    def _run_callback(self, request: pb.Callback) -> None:
        result = run_callback_blocking(self._callbacks.get(request.action), request)
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

    def _background(self, request: pb.Request, on_done: Callable[[_Call], None]) -> None:
        """Send a request whose answer `on_done` handles on the reader thread."""
        call = _Call(on_done)
        request.request_id = next(self._ids)
        with self._state:
            self._calls[request.request_id] = call
        try:
            self._send(pb.ClientMessage(request=request))
        except AgentUnavailable as exc:
            with self._state:
                self._calls.pop(request.request_id, None)
            call.finish(None, exc)

    def _request(
        self, request: pb.Request, timeout: float | None = None, slack: float = 0.0
    ) -> pb.Reply:
        """Send a request on the call link and wait up to `timeout` + `slack` for its answer.

        While the session is broken the request waits for the reconnect, up to `timeout` (or
        the connect timeout); a link that breaks after the request left fails it. Only an
        acquire without a timeout waits for its answer without end (it is queued).
        """
        deadline = time.monotonic() + (self._connect_timeout if timeout is None else timeout)
        reply_timeout = reply_wait(request, timeout, slack)
        while True:
            self._ready(deadline - time.monotonic())
            with self._call_lock:
                try:
                    link = self._call_link()
                    return self._call(link, request, reply_timeout)
                except _NotSent as exc:
                    # The agent went away (the reader thread hears of it on the session and
                    # reconnects; then this request goes out again) or it refuses call links.
                    wait = min(LINK_GRACE_S, max(0.0, deadline - time.monotonic()))
                    if not self._disconnected.wait(wait):
                        raise AgentUnavailable(
                            f"cannot open a call link to the Baton agent at {self.socket} "
                            f"while its session is up: {exc.__cause__ or exc}"
                        ) from None

    def _call_link(self) -> _CallLink:
        """The open call link of the current session (opened now if needed)."""
        with self._state:
            link, token = self._link, self._token
        if link is not None and link.token == token:
            return link
        if link is not None:
            link.close()
        try:
            link = _CallLink.open(self.socket, token, self._connect_timeout)
        except (OSError, ValueError, KeyError, framing.FrameError) as exc:
            raise _NotSent from exc
        with self._state:
            self._link = link
        return link

    def _call(self, link: _CallLink, request: pb.Request, timeout: float | None) -> pb.Reply:
        request.request_id = next(self._ids)
        kind = request.WhichOneof("kind")
        try:
            link.send(pb.ClientMessage(request=request))
        except OSError:
            self._drop_link(link)
            raise _NotSent from None
        reply = None
        try:
            reply = self._answer(link, request.request_id, timeout)
        finally:
            if reply is None and kind == "acquire":  # timed out, or interrupted: leave the queue
                self._withdraw(link, request.request_id)
        if reply is None:
            raise AgentUnavailable(
                f"the Baton agent at {self.socket} did not answer a {kind} request "
                f"within {timeout:.3g} s"
            )
        if reply.HasField("error"):
            raise from_status(reply.error.code, reply.error.message, self.socket)
        return reply

    def _answer(self, link: _CallLink, request_id: int, timeout: float | None) -> pb.Reply | None:
        """The reply to `request_id` read from `link`; None if `timeout` passes first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                return None
            try:
                reply = link.read(wait)
            except TimeoutError:
                return None
            except (OSError, framing.FrameError) as exc:
                self._drop_link(link)
                raise AgentUnavailable(
                    f"lost the Baton agent at {self.socket} ({exc}); reconnecting, retry the call"
                ) from None
            if reply is None:
                self._drop_link(link)
                raise AgentUnavailable(
                    f"lost the Baton agent at {self.socket}; reconnecting, retry the call"
                )
            if reply.request_id == request_id:
                return reply
            self._stray(link, reply)

    def _stray(self, link: _CallLink, reply: pb.Reply) -> None:
        """An answer nobody waits for: a turn granted to a withdrawn acquire is handed back."""
        if reply.HasField("lease"):
            release = pb.Request(release=pb.YieldRequest(lease_id=reply.lease.lease_id))
            release.request_id = next(self._ids)
            with contextlib.suppress(OSError):
                link.send(pb.ClientMessage(request=release))
        elif reply.HasField("error"):
            log.debug("late answer %d: %s", reply.request_id, reply.error.message)

    def _withdraw(self, link: _CallLink, request_id: int) -> None:
        """Take a pending acquire off the queue; a turn granted meanwhile is handed back."""
        cancel = pb.Request(request_id=request_id, cancel=pb.CancelRequest())
        try:
            link.send(pb.ClientMessage(request=cancel))
            reply = self._answer(link, request_id, REPLY_TIMEOUT_S)
        except (OSError, AgentUnavailable):
            reply = None
        if reply is None:  # closing the link withdraws it too
            self._drop_link(link)
        else:
            self._stray(link, reply)

    def _drop_link(self, link: _CallLink) -> None:
        with self._state:
            if self._link is link:
                self._link = None
        link.close()

    # The two calls.

    def acquire(self, timeout: float | None = None, gpus: Sequence[str] | None = None) -> LeaseInfo:
        """Block until this tenant's turn; `AcquireTimeout` after `timeout` seconds."""
        if self.lease is not None:
            return self.lease
        timeout_ms = 0 if timeout is None else max(1, int(timeout * 1000))
        request = pb.Request(acquire=pb.AcquireRequest(gpus=gpus or (), timeout_ms=timeout_ms))
        reply = self._request(request, timeout, slack=5)
        lease = LeaseInfo.from_pb(reply.lease)
        with self._state:
            self.lease, self.resuming = lease, False
            self._renew_at = time.monotonic() + self._renew_interval
        return lease

    def yield_(self) -> None:
        """End the turn. Parking is lazy: memory moves only if the next tenant needs the room."""
        with self._state:
            lease, resuming = self.lease, self.resuming
            if lease is None and not resuming:
                raise NotHolding("yield_() without a turn: call acquire() first")
            self.lease, self.resuming, self._renew_at = None, False, None
        release = pb.YieldRequest(lease_id=lease.lease_id if lease else "")
        try:
            self._request(pb.Request(release=release))
        except AgentUnavailable:  # the turn may outlive the agent's restart: yield can be retried
            with self._state:
                if self.lease is None and not self.resuming:
                    self.lease, self.resuming = lease, resuming
                    if lease is not None:
                        self._renew_at = time.monotonic() + self._renew_interval
            raise

    @contextlib.contextmanager
    def turn(self, timeout: float | None = None) -> Iterator[LeaseInfo]:
        """`with baton.turn(): ...`, or as a decorator, `@baton.turn()`."""
        lease = self.acquire(timeout)
        try:
            yield lease
        finally:
            if self.lease is not None or self.resuming:
                self.yield_()

    # Renewal (on the reader thread).

    def _renew_if_due(self) -> None:
        with self._state:
            lease, due = self.lease, self._renew_at
            if lease is None or due is None or time.monotonic() < due:
                return
            self._renew_at = None  # until this renewal is answered

        def done(call: _Call) -> None:
            self._renewed(lease, call)

        self._background(pb.Request(renew=pb.RenewRequest(lease_id=lease.lease_id)), done)

    def _renewed(self, lease: LeaseInfo, call: _Call, reclaiming: bool = False) -> None:
        try:
            renewed = LeaseInfo.from_pb(call.result(self.socket).lease)
        except LeaseLost as exc:
            with self._state:
                if self.lease is lease:
                    self.lease, self._renew_at = None, None
                    if reclaiming:
                        log.warning(
                            "the turn %s was lost while the agent restarted", lease.lease_id
                        )
                    else:
                        log.warning("lease %s lost: %s", lease.lease_id, exc)
            return
        except BatonError as exc:
            log.info("renewing lease %s failed: %s", lease.lease_id, exc)
            renewed = None
        with self._state:
            if self.lease is None or self.lease.lease_id != lease.lease_id:
                if reclaiming:
                    log.info("turn %s ended while it was being reclaimed", lease.lease_id)
                return
            if renewed is not None:
                self.lease = renewed
                if reclaiming:
                    log.warning("kept the turn %s across the agent restart", renewed.lease_id)
            self._renew_at = time.monotonic() + self._renew_interval

    def _reclaim(self) -> None:
        """After a reconnect: tell the new agent that the turn held is still in use."""
        with self._state:
            lease = self.lease
        if lease is None:
            return

        def done(call: _Call) -> None:
            self._renewed(lease, call, reclaiming=True)

        self._background(pb.Request(renew=pb.RenewRequest(lease_id=lease.lease_id)), done)

    # Lifecycle.

    def close(self) -> None:
        """End the session; the agent releases this process's turn and queue places."""
        self._closed.set()
        with self._state:
            sock = self._sock
        if sock is not None:
            self._lost(sock)
        reader = self._reader
        if reader is not None and reader is not threading.current_thread():
            reader.join(timeout=5)

    def __enter__(self) -> Baton:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

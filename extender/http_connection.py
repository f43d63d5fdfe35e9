"""One client connection of the extender's HTTP server (`extender.http`): requests parsed by
httptools, answered in request order, bodies and waits bounded, a graceful close when the
server stops."""

from __future__ import annotations

import asyncio
import functools
import socket
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import httptools

from extender.http_messages import Reply, Request, awaited, call, call_blocking, encode, text

if TYPE_CHECKING:
    from extender.http import HttpServer


@dataclass
class _Incoming:
    """The request being parsed."""

    url: bytearray = field(default_factory=bytearray)
    body: list[bytes] = field(default_factory=list)
    size: int = 0
    expect_continue: bool = False
    head: int = 0
    """Bytes read while its line and headers were unfinished (`Connection.data_received`)."""
    head_done: bool = False


class _RequestRefused(Exception):
    """Raised from a parser callback: the request is answered with `reply` and the connection
    closed."""

    def __init__(self, reply: Reply):
        super().__init__(reply.body.decode(errors="replace"))
        self.reply = reply


class Connection(asyncio.Protocol):
    """One client connection: parse, dispatch in order, answer, keep alive or close."""

    def __init__(self, server: HttpServer):
        self._server = server
        self._loop = asyncio.get_running_loop()
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._incoming: _Incoming | None = None
        self._queue: deque[tuple[Request, bool]] = deque()
        self._running = False
        self._closing = False
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._client_cert = False

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        # Only a certificate the TLS handshake verified is given here (empty without one).
        self._client_cert = bool(transport.get_extra_info("peercert"))
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # Without it every answer waits out the client's delayed ACK (Nagle).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._server.connections.add(self)
        self._wait(self._server.idle_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self._transport = None
        if self._timer is not None:
            self._timer.cancel()
        self._server.connection_gone()

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(text(400, "bad HTTP request: protocol upgrades are not served here"))
        except httptools.HttpParserError as err:
            cause = err.__context__
            if isinstance(cause, _RequestRefused):
                self._refuse(cause.reply)
            else:
                self._refuse(text(400, f"bad HTTP request: {err}"))
        else:
            self._check_head(len(data))

    # -- httptools callbacks

    def on_message_begin(self) -> None:
        self._incoming = _Incoming()
        self._wait(self._server.request_timeout_s)

    def on_url(self, url: bytes) -> None:
        assert self._incoming is not None
        self._incoming.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self._incoming is not None
        lowered = name.lower()
        if lowered == b"content-length" and value.strip().isdigit():
            self._check_size(int(value))
        elif lowered == b"expect" and value.strip().lower() == b"100-continue":
            self._incoming.expect_continue = True

    def on_headers_complete(self) -> None:
        assert self._incoming is not None
        self._incoming.head_done = True
        if self._incoming.expect_continue and self._transport is not None:
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        assert self._incoming is not None
        self._incoming.size += len(body)
        self._check_size(self._incoming.size)
        self._incoming.body.append(body)

    def on_message_complete(self) -> None:
        incoming, self._incoming = self._incoming, None
        assert incoming is not None
        path = bytes(incoming.url).split(b"?", 1)[0].decode("latin-1")
        method = self._parser.get_method().decode("latin-1")
        request = Request(method, path, b"".join(incoming.body))
        self._queue.append((request, self._parser.should_keep_alive()))
        if self._running:
            if self._transport is not None:
                self._transport.pause_reading()
            return
        self._drain()

    # -- dispatch

    def _drain(self) -> None:
        """Answer queued requests in order until one must wait (a coroutine or a pool)."""
        while self._queue and not self._running and self._transport is not None:
            request, keep_alive = self._queue.popleft()
            route, refusal = self._server.route(request, self._client_cert)
            if refusal is not None:
                self._answer(refusal, keep_alive)
                continue
            assert route is not None
            if route.pool is not None:
                later: asyncio.Future[Reply] = self._loop.run_in_executor(
                    route.pool, call_blocking, route, request
                )
            else:
                reply = call(route, request)
                if isinstance(reply, Reply):
                    self._answer(reply, keep_alive)
                    continue
                later = self._loop.create_task(awaited(request, reply))
            self._running = True
            later.add_done_callback(functools.partial(self._ran, keep_alive=keep_alive))
        if not self._running and self._transport is not None:
            self._transport.resume_reading()
            server = self._server
            self._wait(
                server.idle_timeout_s if self._incoming is None else server.request_timeout_s
            )

    def _ran(self, done: asyncio.Future[Reply], *, keep_alive: bool) -> None:
        self._running = False
        if done.cancelled():
            self.abort()  # the server stopped before it finished
            return
        self._answer(done.result(), keep_alive)
        self._drain()

    def _answer(self, reply: Reply, keep_alive: bool) -> None:
        transport = self._transport
        if transport is None:
            return
        keep_alive = keep_alive and not self._closing
        transport.write(encode(reply, keep_alive))
        if not keep_alive:
            self._queue.clear()
            transport.close()
            self._transport = None

    def _refuse(self, reply: Reply) -> None:
        """Answer a request that cannot be read and close: the stream is not in step any more.
        Behind a running request, the connection closes after its answer instead."""
        self._queue.clear()
        self._closing = True
        if self._transport is not None:
            self._transport.pause_reading()
        if not self._running:
            self._answer(reply, keep_alive=False)

    def _check_head(self, read: int) -> None:
        """Refuse a request whose line and headers are still unfinished after more than
        `max_head` bytes (each read that leaves them unfinished counts whole)."""
        incoming = self._incoming
        if incoming is None or incoming.head_done:
            return
        incoming.head += read
        if incoming.head > self._server.max_head:
            limit = self._server.max_head
            self._refuse(text(431, f"request line and headers over {limit} bytes; not read"))

    def _check_size(self, size: int) -> None:
        if size > self._server.max_body:
            limit = self._server.max_body
            raise _RequestRefused(text(413, f"request body over {limit} bytes; not read"))

    # -- timeouts and stop

    def _wait(self, timeout_s: float) -> None:
        """Close the connection unless something happens within `timeout_s` (a lazy timer:
        moving the deadline later costs nothing; the timer re-arms itself when it fires early)."""
        self._deadline = self._loop.time() + timeout_s
        if self._timer is not None and self._timer.when() > self._deadline:
            self._timer.cancel()  # a shorter wait than the one armed: arm it anew
            self._timer = None
        if self._timer is None:
            self._timer = self._loop.call_at(self._deadline, self._check_deadline)

    def _check_deadline(self) -> None:
        self._timer = None
        if self._transport is None or self._running:
            return
        if self._loop.time() < self._deadline:
            self._timer = self._loop.call_at(self._deadline, self._check_deadline)
        elif self._incoming is not None:
            within = self._server.request_timeout_s
            self._refuse(text(408, f"request not received whole within {within:g} s"))
        else:
            self._transport.close()

    def idle(self) -> bool:
        """Nothing begun, queued or running."""
        return self._incoming is None and not self._queue and not self._running

    def finish(self) -> None:
        """Close now if idle; else after the answers owed (each says `Connection: close`)."""
        self._closing = True
        if self.idle() and self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        """Drop the connection without answering."""
        if self._transport is not None:
            self._transport.abort()

"""A client of the extender's HTTP/1.1 server on plain sockets, and the routes and servers the
tests of `tests/extender/test_http_server.py` speak to (fixtures `gate`, `routes`, `connect`,
served to them by the directory's conftest)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest

from extender.http import TEXT, Reply, Request, Route, Routes, text
from extender.server import ServerThread

WAIT_S = 5.0
"""The bound on every wait for the server."""
GET_FAST = b"GET /fast HTTP/1.1\r\nHost: x\r\n\r\n"
GET_SLOW = b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"


@dataclass
class Gate:
    """Holds the slow route until the test releases it; `events` records what ran, in order."""

    started: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    events: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Answer:
    status: int
    head: bytes
    headers: dict[str, str]
    body: bytes


class Wire:
    """A client socket that reads whole answers, each wait bounded by the socket's timeout."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError(f"the server closed the connection; unread: {self.buf!r}")
        self.buf += chunk

    def head(self) -> bytes:
        """Everything up to and including the blank line that ends an answer's head."""
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        return head + b"\r\n\r\n"

    def answer(self) -> Answer:
        head = self.head()
        status_line, *lines = head.decode("latin-1").rstrip("\r\n").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        size = int(headers["content-length"])
        while len(self.buf) < size:
            self._fill()
        body, self.buf = self.buf[:size], self.buf[size:]
        return Answer(int(status_line.split(" ")[1]), head, headers, body)

    def closed(self) -> bool:
        """The server closes the connection, with nothing more to say."""
        try:
            chunk = self.sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        return chunk == b"" and self.buf == b""

    def silent_for(self, seconds: float) -> bool:
        """Nothing arrives within `seconds` (a bounded check that an answer is held back)."""
        self.sock.settimeout(seconds)
        try:
            self.buf += self.sock.recv(65536)
            return False
        except TimeoutError:
            return True
        finally:
            self.sock.settimeout(WAIT_S)


Connect = Callable[..., Wire]


@pytest.fixture
def gate() -> Gate:
    return Gate()


@pytest.fixture
def routes(gate: Gate) -> Iterator[Routes]:
    pool = ThreadPoolExecutor(1, thread_name_prefix="test-pool")

    def fast(request: Request) -> Reply:
        gate.events.append("fast")
        return text(200, "fast")

    async def slow(request: Request) -> Reply:
        gate.events.append("slow-start")
        gate.started.set()
        await asyncio.to_thread(gate.release.wait, WAIT_S)
        gate.events.append("slow-done")
        return text(200, "slow")

    def pooled(request: Request) -> Reply:
        return text(200, threading.current_thread().name)

    def echo(request: Request) -> Reply:
        return Reply(200, request.body, TEXT)

    def boom(request: Request) -> Reply:
        raise RuntimeError("kaboom")

    async def boom_later(request: Request) -> Reply:
        raise RuntimeError("kaboom later")

    yield {
        ("GET", "/fast"): Route(fast),
        ("GET", "/slow"): Route(slow),
        ("GET", "/pooled"): Route(pooled, pool=pool),
        ("POST", "/echo"): Route(echo),
        ("PUT", "/echo"): Route(echo),
        ("GET", "/boom"): Route(boom),
        ("GET", "/boom-later"): Route(boom_later),
    }
    pool.shutdown(wait=True)


@pytest.fixture
def connect(routes: Routes, gate: Gate) -> Iterator[Connect]:
    """`connect(**limits)`: a connection to a new server of `routes` with those `HttpServer`
    limits; `connect(port)`: one to a running server. At the end every one closes and stops."""
    servers: list[ServerThread] = []
    sockets: list[socket.socket] = []

    def open_wire(port: int | None = None, **limits: float) -> Wire:
        if port is None:
            server = ServerThread(routes)
            for name, value in limits.items():  # read by the server as it serves
                assert name in ("max_body", "max_head", "idle_timeout_s", "request_timeout_s")
                setattr(server.server.http, name, value)
            servers.append(server.start())
            port = server.port
        sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
        sockets.append(sock)
        return Wire(sock)

    try:
        yield open_wire
    finally:
        gate.release.set()
        for sock in sockets:
            sock.close()
        for server in servers:
            server.stop()


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=WAIT_S).close()
    except ConnectionRefusedError:
        return True
    return False

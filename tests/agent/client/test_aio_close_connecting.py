"""`AsyncBaton.close()` while its first connect waits for the agent (its handshake line, or its
welcome to the session): the connection it opened is closed with it. It was left open, not
even collected while the loop ran (the loop still watched it): a socket and, past the hello,
a session that the agent counted as this tenant's, for as long as the program ran."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.client import AsyncBaton, BatonError
from agent.wire.handshake import handshake_path

pytestmark = pytest.mark.timeout(60)
WAIT_S = 10.0
"""Bound on every wait in these tests."""
TOKEN_LINE = b'{"token": "t0k3n"}\n'


class SilentAgent:
    """A handshake socket that greets one connection with `greeting`, then says nothing."""

    def __init__(self, directory: Path, greeting: bytes) -> None:
        self.socket = str(directory / "agent.sock")
        self.greeting = greeting
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(handshake_path(self.socket))
        self._server.listen()
        self._server.settimeout(WAIT_S)
        self.conns: list[socket.socket] = []

    def accept(self) -> socket.socket:
        """The client's connection (greeted), once it came (blocking, `WAIT_S` at most)."""
        conn, _ = self._server.accept()
        conn.settimeout(WAIT_S)
        self.conns.append(conn)
        conn.sendall(self.greeting)
        return conn

    def close(self) -> None:
        self._server.close()
        for conn in self.conns:
            conn.close()


def read_to_end(conn: socket.socket) -> bytes:
    """Everything the client sends until it closes its end (`TimeoutError` after `WAIT_S`)."""
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    return data


@pytest.fixture(params=["handshake", "welcome"])
def silent(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SilentAgent]:
    """Silent before the handshake's line, or after it (the client's hello unanswered)."""
    agent = SilentAgent(tmp_path, b"" if request.param == "handshake" else TOKEN_LINE)
    yield agent
    agent.close()


def test_close_during_the_first_connect_closes_its_connection(silent: SilentAgent) -> None:
    async def scenario() -> None:
        baton = AsyncBaton(silent.socket, ["GPU-0"], name="t", connect_timeout=WAIT_S)
        waiting = asyncio.create_task(baton.acquire(WAIT_S))
        conn = await asyncio.to_thread(silent.accept)
        if silent.greeting:  # the client waits for the welcome once its hello came
            assert await asyncio.to_thread(conn.recv, 65536)
        await asyncio.wait_for(baton.close(), WAIT_S)
        with pytest.raises(BatonError, match="this AsyncBaton client is closed"):
            await asyncio.wait_for(waiting, WAIT_S)
        await asyncio.to_thread(read_to_end, conn)  # returns as the client's end closes

    asyncio.run(scenario())

"""Another program on the agent's handshake socket: both clients say in one line that it is not
the agent (naming what came), or that no handshake line came within their connect timeout,
rather than a TypeError or a wait for a line that never ends."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.client import AgentUnavailable, AsyncBaton, Baton
from agent.wire.handshake import MAX_TOKEN_LINE, handshake_path

ANSWERS = {
    "a JSON list": b"[1, 2]\n",
    "an object without a token": b'{"pid": 7}\n',
    "a token that is no string": b'{"token": 7}\n',
    "text": b"HTTP/1.1 400 Bad Request\r\n\r\n",
    "no line end": b"x" * (MAX_TOKEN_LINE * 4),
}


class Impostor:
    """Answers every connection to the handshake socket with `answer`, then keeps it open."""

    def __init__(self, directory: Path, answer: bytes) -> None:
        self.socket = str(directory / "agent.sock")
        self._answer = answer
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(handshake_path(self.socket))
        self._server.listen()
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self._conns.append(conn)
            with contextlib.suppress(OSError):
                conn.sendall(self._answer)

    def close(self) -> None:
        self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        self._thread.join(5)
        for conn in self._conns:
            conn.close()


@pytest.fixture(params=sorted(ANSWERS))
def impostor(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Impostor]:
    found = Impostor(tmp_path, ANSWERS[request.param])
    yield found
    found.close()


def test_the_blocking_client_says_the_socket_is_not_an_agents(impostor: Impostor) -> None:
    with pytest.raises(AgentUnavailable, match="not a Baton agent's handshake") as refused:
        baton = Baton(impostor.socket, ["GPU-0"], name="t", connect_timeout=5)
        try:
            baton.acquire(timeout=5)
        finally:
            baton.close()
    assert "\n" not in str(refused.value) and impostor.socket in str(refused.value)


def test_the_asyncio_client_says_the_socket_is_not_an_agents(impostor: Impostor) -> None:
    async def scenario() -> None:
        baton = AsyncBaton(impostor.socket, ["GPU-0"], name="t", connect_timeout=1)
        try:
            await asyncio.wait_for(baton.acquire(timeout=5), 10)
        finally:
            await baton.close()

    said = "not a Baton agent's handshake|no handshake line within 1 s"
    with pytest.raises(AgentUnavailable, match=said) as refused:
        asyncio.run(scenario())
    assert "\n" not in str(refused.value) and impostor.socket in str(refused.value)

"""`AsyncBaton(transport="grpc")` keeps the promises the direct transport keeps: its session's
task ends with its event loop, an agent whose gRPC API cannot be reached is named in one line
within the connect timeout."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.client import AgentUnavailable, AsyncBaton
from agent.wire.handshake import handshake_path
from tests.harness.agent import AgentRunner

pytestmark = pytest.mark.timeout(60)
WAIT_S = 10.0
"""Bound on every wait in these tests."""


def test_an_event_loop_that_ends_with_the_session_open_ends(agent: AgentRunner) -> None:
    """`asyncio.run` returns with the client neither closed nor yielded: the session's task is
    cancelled with the loop and ends (rather than take the cancel for the call's end, reconnect
    and serve the session for ever); the agent takes the turn back with the session."""
    baton = AsyncBaton(agent.socket, ["GPU-0"], name="ended", transport="grpc")

    async def hold() -> None:
        await baton.acquire(timeout=WAIT_S)

    returned = threading.Event()

    def run() -> None:
        asyncio.run(hold())
        returned.set()

    threading.Thread(target=run, daemon=True).start()
    assert returned.wait(WAIT_S), "asyncio.run did not return: the session's task went on"

    async def next_tenant() -> None:
        async with AsyncBaton(agent.socket, ["GPU-0"], name="next", transport="grpc") as other:
            await other.acquire(timeout=WAIT_S)
            await other.yield_()

    asyncio.run(asyncio.wait_for(next_tenant(), 2 * WAIT_S))


class SilentApi:
    """A handshake socket that hands out a token, beside a gRPC socket that accepts connections
    and never answers (a wedged agent), or that is not there (`silent=False`)."""

    def __init__(self, directory: Path, silent: bool) -> None:
        self.socket = str(directory / "agent.sock")
        self._conns: list[socket.socket] = []
        self._servers = [self._serve(handshake_path(self.socket), b'{"token": "t", "pid": 0}\n')]
        if silent:
            self._servers.append(self._serve(self.socket, b""))

    def _serve(self, path: str, line: bytes) -> socket.socket:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen()
        threading.Thread(target=self._accept, args=(server, line), daemon=True).start()
        return server

    def _accept(self, server: socket.socket, line: bytes) -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            self._conns.append(conn)
            with contextlib.suppress(OSError):
                conn.sendall(line)

    def close(self) -> None:
        for server in self._servers:
            with contextlib.suppress(OSError):
                server.shutdown(socket.SHUT_RDWR)
            server.close()
        for conn in self._conns:
            conn.close()


@pytest.fixture(params=[True, False], ids=["silent", "absent"])
def silent_api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SilentApi]:
    api = SilentApi(tmp_path, request.param)
    yield api
    api.close()


def test_an_agent_whose_grpc_api_does_not_answer_is_named_in_one_line(
    silent_api: SilentApi,
) -> None:
    """Not `AcquireTimeout: Deadline Exceeded` (no turn was asked for, the socket unnamed):
    the agent cannot be reached, said as the direct transport says it, within the connect
    timeout."""

    async def scenario() -> None:
        baton = AsyncBaton(
            silent_api.socket, ["GPU-0"], name="t", connect_timeout=1, transport="grpc"
        )
        try:
            await asyncio.wait_for(baton.acquire(timeout=WAIT_S), WAIT_S)
        finally:
            await baton.close()

    with pytest.raises(AgentUnavailable) as unreachable:
        asyncio.run(scenario())
    message = str(unreachable.value)
    assert message.startswith(f"cannot reach the Baton agent at {silent_api.socket}"), message
    assert "\n" not in message

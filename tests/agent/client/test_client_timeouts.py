"""An agent that stops answering: the clients say so within their reply timeout, not never."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.client import AgentUnavailable, AsyncBaton, Baton
from agent.wire.handshake import handshake_path
from baton._pb import agent_pb2 as pb
from baton.contract import framing

REPLY_TIMEOUT_S = 0.3


class MuteAgent:
    """Speaks the direct session: welcomes every connection and grants every acquire, but never
    answers a yield."""

    def __init__(self, directory: Path) -> None:
        self.socket = str(directory / "agent.sock")
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(handshake_path(self.socket))
        self._server.listen()
        self._server.settimeout(10)
        self._conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        try:
            conn.sendall(json.dumps({"token": "mute-token", "pid": 0}).encode() + b"\n")
            reader = framing.BlockingReader(conn)
            tenant = pb.Tenant(tenant_id="local/mute", name="mute", gpus=["GPU-0"])
            while (message := reader.read(pb.ClientMessage)) is not None:
                if message.HasField("hello"):
                    answer = pb.AgentMessage(welcome=pb.Welcome(tenant=tenant))
                elif message.request.HasField("acquire"):
                    lease = pb.Lease(lease_id="l1", gpus=["GPU-0"], fencing_tokens={"GPU-0": 1})
                    reply = pb.Reply(request_id=message.request.request_id, lease=lease)
                    answer = pb.AgentMessage(reply=reply)
                else:
                    continue  # a yield (or a renewal): no answer, ever
                conn.sendall(framing.encode(answer))
        except OSError:
            pass

    def close(self) -> None:
        self._stop.set()
        self._server.close()
        for conn in self._conns:
            conn.close()


@pytest.fixture
def mute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MuteAgent]:
    monkeypatch.setattr("agent.client.types.REPLY_TIMEOUT_S", REPLY_TIMEOUT_S)
    agent = MuteAgent(tmp_path)
    yield agent
    agent.close()


def test_the_blocking_client_gives_up_on_an_unanswered_yield(mute: MuteAgent) -> None:
    baton = Baton(mute.socket, ["GPU-0"], name="mute", renew_interval=60)
    try:
        assert baton.acquire().lease_id == "l1"
        with pytest.raises(
            AgentUnavailable, match=r"did not answer a release request within 0\.3 s"
        ):
            baton.yield_()
        assert baton.lease is not None  # kept, so that the yield can be tried again
    finally:
        baton.close()


def test_the_asyncio_client_gives_up_on_an_unanswered_yield(mute: MuteAgent) -> None:
    async def scenario() -> None:
        baton = AsyncBaton(mute.socket, ["GPU-0"], name="mute", renew_interval=60)
        try:
            assert (await baton.acquire()).lease_id == "l1"
            with pytest.raises(AgentUnavailable, match="did not answer a release request"):
                await asyncio.wait_for(baton.yield_(), 10)
            assert baton.lease is not None
        finally:
            await baton.close()

    asyncio.run(scenario())

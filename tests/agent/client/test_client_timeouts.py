"""An agent that stops answering: the clients say so within their reply timeout, not never."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from agent.client import AgentUnavailable, AsyncBaton, Baton, LeaseInfo, LeaseLost
from agent.client.session_core import SessionCore
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
                elif (reply := self._reply(message.request)) is not None:
                    answer = pb.AgentMessage(reply=reply)
                else:
                    continue  # a yield (or a renewal): no answer, ever
                conn.sendall(framing.encode(answer))
        except OSError:
            pass

    def _reply(self, request: pb.Request) -> pb.Reply | None:
        if request.HasField("acquire"):
            lease = pb.Lease(lease_id="l1", gpus=["GPU-0"], fencing_tokens={"GPU-0": 1})
            return pb.Reply(request_id=request.request_id, lease=lease)
        return None

    def close(self) -> None:
        self._stop.set()
        self._server.close()
        for conn in self._conns:
            conn.close()


class LostYieldAgent(MuteAgent):
    """A `MuteAgent` whose yields end the turn (their answers lost on the way) and which
    answers renewals: the lease while held, "no such lease" once yielded."""

    def __init__(self, directory: Path) -> None:
        self.yielded = threading.Event()
        super().__init__(directory)

    def _reply(self, request: pb.Request) -> pb.Reply | None:
        if request.HasField("release"):
            self.yielded.set()
        if not request.HasField("renew"):
            return super()._reply(request)
        if self.yielded.is_set():
            lost = pb.ErrorStatus(code=grpc.StatusCode.NOT_FOUND.value[0], message="no such lease")
            return pb.Reply(request_id=request.request_id, error=lost)
        lease = pb.Lease(lease_id="l1", gpus=["GPU-0"], fencing_tokens={"GPU-0": 1})
        return pb.Reply(request_id=request.request_id, lease=lease)


def lost_after_renewal(core: SessionCore) -> threading.Event:
    """Set once `core` has taken in a renewal answered "no such lease"."""
    heard, renewed = threading.Event(), core.renewed

    def recorded(lease: LeaseInfo, outcome: object, reclaiming: bool = False) -> None:
        renewed(lease, outcome, reclaiming)  # type: ignore[arg-type]
        if isinstance(outcome, LeaseLost):
            heard.set()

    core.renewed = recorded  # type: ignore[method-assign]
    return heard


@pytest.fixture
def lost_yield(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LostYieldAgent]:
    monkeypatch.setattr("agent.client.types.REPLY_TIMEOUT_S", REPLY_TIMEOUT_S)
    agent = LostYieldAgent(tmp_path)
    yield agent
    agent.close()


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


def test_a_yield_retried_after_its_renewal_found_the_turn_gone_ends_quietly(
    lost_yield: LostYieldAgent,
) -> None:
    """The yield reached the agent but its answer did not come back (the session stayed up);
    the background renewal then hears "no such lease": the yield made again ends nothing,
    quietly, as when the agent answers it "no such lease" itself (docs/client.md, Sessions)."""
    baton = Baton(lost_yield.socket, ["GPU-0"], name="mute", renew_interval=0.05)
    heard = lost_after_renewal(baton._core)
    try:
        baton.acquire()
        with pytest.raises(AgentUnavailable, match="did not answer a release request"):
            baton.yield_()
        assert heard.wait(10), "the renewal never heard the turn was gone"
        assert baton.lease is None
        baton.yield_()  # the turn had ended: not NotHolding
    finally:
        baton.close()


def test_the_asyncio_client_retries_a_yield_its_renewal_found_gone_quietly(
    lost_yield: LostYieldAgent,
) -> None:
    async def scenario() -> None:
        baton = AsyncBaton(lost_yield.socket, ["GPU-0"], name="mute", renew_interval=0.05)
        heard = lost_after_renewal(baton._core)
        try:
            await baton.acquire()
            with pytest.raises(AgentUnavailable, match="did not answer a release request"):
                await asyncio.wait_for(baton.yield_(), 10)
            assert await asyncio.to_thread(heard.wait, 10), "the renewal never heard"
            assert baton.lease is None
            await asyncio.wait_for(baton.yield_(), 10)  # not NotHolding
        finally:
            await baton.close()

    asyncio.run(scenario())

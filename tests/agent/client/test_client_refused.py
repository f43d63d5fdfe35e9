"""An agent that restarts and then refuses the client's session: the calls say why, and the
client keeps trying where the refusal may pass."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from agent.client import (
    AgentUnavailable,
    AsyncBaton,
    Baton,
    InvalidRequest,
    PermissionDenied,
    Refused,
)
from agent.client.refusals import Refusals
from agent.parking.setup import ParkingOptions
from agent.wire.handshake import handshake_path
from baton._pb import agent_pb2 as pb
from baton.contract import framing
from baton.contract.names import fake_gpu_uuid
from tests.agent.client.resume_clients import call
from tests.harness.agent import AgentRunner

pytestmark = pytest.mark.timeout(60)

NEVER = "process 7 (UID 1000) runs in no pod, and this agent serves pods"
NOT_YET = "process 7 runs in pod p-1, which the agent has not seen with Baton GPUs assigned (yet)"


class RefusingAgent:
    """Speaks the direct session: welcomes the client and grants its turns until `restart`,
    which drops every connection; from then on it refuses each session's Hello, with the
    refusal given, until `restart(None)`."""

    def __init__(self, directory: Path) -> None:
        self.socket = str(directory / "agent.sock")
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(handshake_path(self.socket))
        self._server.listen()
        self._conns: list[socket.socket] = []
        self._refusal: pb.ErrorStatus | None = None
        self._lock = threading.Lock()
        self.refused = threading.Event()
        """Set once a Hello was refused: the client heard of the restart and reconnects."""
        threading.Thread(target=self._accept, daemon=True).start()

    def restart(self, code: grpc.StatusCode | None, message: str = "") -> None:
        with self._lock:
            refusal = None if code is None else pb.ErrorStatus(code=code.value[0], message=message)
            self._refusal, conns, self._conns = refusal, self._conns, []
            self.refused.clear()
        for conn in conns:
            conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(20)
        try:
            conn.sendall(json.dumps({"token": "t", "pid": 0}).encode() + b"\n")
            reader = framing.BlockingReader(conn)
            while (message := reader.read(pb.ClientMessage)) is not None:
                conn.sendall(framing.encode(self._answer(message)))
        except (OSError, framing.FrameError):
            pass

    def _answer(self, message: pb.ClientMessage) -> pb.AgentMessage:
        with self._lock:
            refusal = self._refusal
        if message.HasField("hello") and refusal is not None and message.hello.HasField("register"):
            self.refused.set()
            return pb.AgentMessage(refused=refusal)
        if message.HasField("hello"):
            tenant = pb.Tenant(tenant_id="local/t", name="t", gpus=["GPU-0"])
            return pb.AgentMessage(welcome=pb.Welcome(tenant=tenant))
        reply = pb.Reply(request_id=message.request.request_id)
        if message.request.HasField("acquire"):
            lease = pb.Lease(lease_id="l1", gpus=["GPU-0"], fencing_tokens={"GPU-0": 1})
            reply.lease.CopyFrom(lease)
        else:
            reply.released.CopyFrom(pb.YieldResponse())
        return pb.AgentMessage(reply=reply)

    def close(self) -> None:
        self._server.close()
        self.restart(None)


@pytest.fixture
def stand_in(workdir: str) -> Iterator[RefusingAgent]:
    agent = RefusingAgent(Path(workdir))
    yield agent
    agent.close()


def tenant(kind: str, socket: str, gpu: str = "GPU-0") -> Baton | AsyncBaton:
    if kind == "blocking":
        return Baton(socket, [gpu], name="t", connect_timeout=5, renew_interval=60)
    transport = "grpc" if kind == "asyncio-grpc" else "direct"
    return AsyncBaton(
        socket, [gpu], name="t", connect_timeout=5, renew_interval=60, transport=transport
    )


@pytest.mark.parametrize("kind", ["blocking", "asyncio"])
def test_a_refusal_for_good_is_what_the_calls_say_at_once(
    stand_in: RefusingAgent, kind: str
) -> None:
    """The restarted agent refuses the tenant (PERMISSION_DENIED: it never will take it): an
    acquire says so, naming the socket, long before its timeout."""

    async def scenario() -> None:
        baton = tenant(kind, stand_in.socket)
        try:
            await call(baton.connect)
            stand_in.restart(grpc.StatusCode.PERMISSION_DENIED, NEVER)
            assert await asyncio.to_thread(stand_in.refused.wait, 10)
            with pytest.raises(PermissionDenied) as refused:
                await asyncio.wait_for(call(baton.acquire, 30), 5)
            message = str(refused.value)
            assert NEVER in message and stand_in.socket in message and "\n" not in message
        finally:
            await call(baton.close)

    asyncio.run(scenario())


@pytest.mark.parametrize("kind", ["blocking", "asyncio"])
def test_a_refusal_that_may_pass_is_retried_and_named_meanwhile(
    stand_in: RefusingAgent, kind: str
) -> None:
    """The restarted agent has not seen the tenant's pod yet (FAILED_PRECONDITION): the client
    keeps trying, a call that gives up meanwhile says what the agent answered, and once the
    agent welcomes the tenant the next acquire has its turn."""

    async def scenario() -> None:
        baton = tenant(kind, stand_in.socket)
        try:
            await call(baton.connect)
            stand_in.restart(grpc.StatusCode.FAILED_PRECONDITION, NOT_YET)
            assert await asyncio.to_thread(stand_in.refused.wait, 10)
            with pytest.raises(AgentUnavailable, match="still reconnecting") as waited:
                await call(baton.acquire, 1)
            assert NOT_YET in str(waited.value)
            stand_in.restart(None)
            assert (await call(baton.acquire, 20)).lease_id == "l1"
        finally:
            await call(baton.close)

    asyncio.run(scenario())


@pytest.mark.parametrize("kind", ["blocking", "asyncio", "asyncio-grpc"])
def test_an_agent_restarted_without_the_tenants_gpu_is_heard(workdir: str, kind: str) -> None:
    """A real agent restarted on a node that lost the tenant's GPU refuses its registration
    (INVALID_ARGUMENT, for good): the tenant's next acquire says so at once."""
    gpu = fake_gpu_uuid(1)
    first = AgentRunner(workdir, parking=ParkingOptions(backend="app", fake_gpus="2x100"))
    second = AgentRunner(workdir, parking=ParkingOptions(backend="app", fake_gpus="1x100"))

    async def scenario() -> None:
        baton = tenant(kind, first.socket, gpu)
        try:
            await call(baton.acquire, 10)
            await call(baton.yield_)
            await asyncio.to_thread(first.stop)
            await asyncio.to_thread(second.start)
            with pytest.raises(InvalidRequest, match=f"{gpu}: not a GPU of this node") as refused:
                await asyncio.wait_for(call(baton.acquire, 30), 10)
            assert first.socket in str(refused.value)
        finally:
            await call(baton.close)

    first.start()
    try:
        asyncio.run(scenario())
    finally:
        second.stop()
        first.stop()


def test_what_the_calls_say_follows_the_agents_latest_answer() -> None:
    refusals = Refusals("/run/baton/agent.sock")
    assert refusals.final() is None
    assert str(refusals.still_reconnecting(2)).endswith("still reconnecting after 2 s")
    refusals.heard(PermissionDenied(NEVER))
    final = refusals.final()
    assert isinstance(final, PermissionDenied) and "/run/baton/agent.sock" in str(final)
    refusals.heard(AgentUnavailable("away again"))  # what it says next is not known: calls wait
    assert refusals.final() is None
    assert str(refusals.still_reconnecting(2)).endswith(f"last refused the session: {NEVER}")
    refusals.heard(Refused(NOT_YET + "\n"))  # may pass: said only by a call that gave up
    assert refusals.final() is None
    assert str(refusals.still_reconnecting(2)).endswith(NOT_YET)
    refusals.welcomed()
    assert "refused" not in str(refusals.still_reconnecting(2))

"""The direct session on the handshake socket, spoken by hand: frames, refusals, call links."""

from __future__ import annotations

import json
import logging
import select
import socket
import struct

import pytest

from agent.client import Baton
from agent.wire.handshake import handshake_path
from baton._pb import agent_pb2 as pb
from baton.contract import framing
from tests.harness.agent import AgentRunner

GPU = "GPU-0"
CANCELLED = 1  # grpc.StatusCode.CANCELLED
UNAUTHENTICATED = 16
INVALID_ARGUMENT = 3


class Raw:
    """One handshake connection, frames written and read by the test."""

    def __init__(self, agent: AgentRunner) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(handshake_path(agent.socket))
        line = b""
        while not line.endswith(b"\n"):
            line += self.sock.recv(1)
        self.token = json.loads(line)["token"]
        self.reader = framing.BlockingReader(self.sock)

    def send(self, message: pb.ClientMessage) -> None:
        self.sock.sendall(framing.encode(message))

    def read(self) -> pb.AgentMessage | None:
        return self.reader.read(pb.AgentMessage)

    def hello(self, **fields: object) -> pb.AgentMessage | None:
        self.send(pb.ClientMessage(hello=pb.Hello(**fields)))  # type: ignore[arg-type]
        return self.read()

    def request(self, request_id: int, **kind: object) -> None:
        self.send(pb.ClientMessage(request=pb.Request(request_id=request_id, **kind)))  # type: ignore[arg-type]

    def close(self) -> None:
        self.sock.close()


def register(name: str) -> pb.RegisterRequest:
    return pb.RegisterRequest(name=name, gpus=[GPU])


def session(agent: AgentRunner, name: str) -> Raw:
    raw = Raw(agent)
    welcome = raw.hello(register=register(name))
    assert welcome is not None and welcome.welcome.tenant.name == name
    return raw


def test_a_session_and_its_call_link_take_a_turn(agent: AgentRunner) -> None:
    main = session(agent, "framed")
    calls = Raw(agent)
    try:
        welcome = calls.hello(session_token=main.token)
        assert welcome is not None and welcome.welcome.tenant.name == "framed"
        calls.request(1, acquire=pb.AcquireRequest())
        granted = calls.read()
        assert granted is not None and granted.reply.request_id == 1
        lease = granted.reply.lease
        assert lease.fencing_tokens[GPU] == 1
        calls.request(2, release=pb.YieldRequest(lease_id=lease.lease_id))
        released = calls.read()
        assert released is not None and released.reply.request_id == 2
        assert released.reply.HasField("released")
    finally:
        calls.close()
        main.close()


def test_a_call_link_ends_with_its_session(agent: AgentRunner) -> None:
    main = session(agent, "short-lived")
    calls = Raw(agent)
    try:
        welcome = calls.hello(session_token=main.token)
        assert welcome is not None and welcome.HasField("welcome")
        main.close()
        assert calls.read() is None  # the agent closed the call link too
    finally:
        calls.close()


def test_a_session_must_start_with_hello(agent: AgentRunner) -> None:
    raw = Raw(agent)
    try:
        raw.request(1, acquire=pb.AcquireRequest())
        refused = raw.read()
        assert refused is not None and refused.refused.code == INVALID_ARGUMENT
        assert "starts with Hello, not request" in refused.refused.message
        assert raw.read() is None  # and the agent closes it
    finally:
        raw.close()


def test_a_refused_registration_says_why(agent: AgentRunner) -> None:
    raw = Raw(agent)
    try:
        refused = raw.hello(register=pb.RegisterRequest(name="nameless-gpus"))
        assert refused is not None and refused.HasField("refused")
        assert "registers with a name and its GPUs" in refused.refused.message
    finally:
        raw.close()


def test_a_call_link_needs_a_live_session_of_the_same_process(agent: AgentRunner) -> None:
    raw = Raw(agent)
    try:
        refused = raw.hello(session_token="made-up")
        assert refused is not None and refused.refused.code == UNAUTHENTICATED
        assert "joins a session its own process opened" in refused.refused.message
    finally:
        raw.close()


def _bad_reads(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize(
    ("in_session", "size", "limit"),
    [
        (True, framing.MAX_FRAME_BYTES + 1, framing.MAX_FRAME_BYTES),
        (False, framing.MAX_FRAME_BYTES, framing.HELLO_MAX_BYTES),
    ],
    ids=["in-a-session", "before-hello"],
)
def test_an_oversized_frame_ends_the_connection_not_the_agent(
    agent: AgentRunner, caplog: pytest.LogCaptureFixture, in_session: bool, size: int, limit: int
) -> None:
    """Its header is enough to refuse it, at once: a peer that has not said Hello cannot make
    the agent wait for, and hold, a call's worth of frame (4 MiB) on each connection it opens."""
    raw = session(agent, "oversized") if in_session else Raw(agent)
    try:
        raw.sock.sendall(struct.pack("!I", size))  # a header, and no body
        assert raw.read() is None
    finally:
        raw.close()
    over = f"a frame of {size} bytes is over the limit of {limit}"
    assert _bad_reads(caplog) == [f"direct session ended on a bad read: {over}"]
    with Baton(agent.socket, [GPU], name="after") as baton:  # the agent still serves
        baton.acquire(timeout=5)
        baton.yield_()


def test_a_withdrawn_acquire_is_answered_cancelled_and_leaves_the_queue(
    agent: AgentRunner,
) -> None:
    holder, waiter = session(agent, "holder"), session(agent, "waiter")
    try:
        holder.request(1, acquire=pb.AcquireRequest())
        held = holder.read()
        assert held is not None and held.reply.HasField("lease")
        waiter.request(7, acquire=pb.AcquireRequest())
        agent.wait_event(lambda e: e.kind == "queued" and e.tenant_id.endswith("waiter"))
        waiter.request(7, cancel=pb.CancelRequest())
        cancelled = waiter.read()
        assert cancelled is not None and cancelled.reply.request_id == 7
        assert cancelled.reply.error.code == CANCELLED
        holder.request(2, release=pb.YieldRequest(lease_id=held.reply.lease.lease_id))
        assert holder.read() is not None
        gpu = agent.status()["gpus"][GPU]
        assert gpu["holder"] is None and gpu["queue"] == []
    finally:
        holder.close()
        waiter.close()


def test_framing_refuses_what_it_cannot_carry() -> None:
    with pytest.raises(framing.FrameError, match="is not a AgentMessage"):
        framing.decode(pb.AgentMessage, b"\xff\xff\xff")


@pytest.mark.parametrize("how", ["reset", "cut mid-frame"])
def test_a_peer_gone_mid_session_is_no_bad_read(
    agent: AgentRunner, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    """A tenant that ends with the agent's grant unread (the kernel resets the connection), or
    amid a frame it writes, as a stopped bench's tenants do: the session ends, with no warning."""
    caplog.set_level(logging.DEBUG, logger="agent.server.direct_session")
    raw = session(agent, "stopped")
    mark = agent.mark()
    try:
        if how == "reset":
            raw.request(1, acquire=pb.AcquireRequest())
            assert select.select([raw.sock], [], [], 10)[0], "no grant came"
        else:
            raw.sock.sendall(struct.pack("!I", 100) + b"\x08")
    finally:
        raw.close()
    agent.wait_event(
        lambda e: e.kind == "tenant_gone" and e.tenant_id == "local/stopped", since=mark
    )
    assert _bad_reads(caplog) == []
    said = [r.getMessage() for r in caplog.records if r.name == "agent.server.direct_session"]
    why = "Connection reset by peer" if how == "reset" else "ended inside a frame of 100 bytes"
    assert [line for line in said if why in line], said

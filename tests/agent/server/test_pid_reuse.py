"""A local tenant's PID outlives its process when it never opened a session (a bare gRPC caller:
Register, then unary calls): a process of another user that the kernel later gives that PID
is not that tenant. Its own user's is, as it could register as the tenant anyway."""

from __future__ import annotations

import grpc
import pytest

from agent.wire.handshake import session_metadata
from baton._pb import agent_pb2 as pb
from baton._pb import agent_pb2_grpc
from tests.harness.agent import AgentRunner

PID = 4_000_001
"""The PID alice's process had, given by the kernel to whoever starts next (no real process)."""
ALICE, MALLORY = 1000, 1001


Stub = tuple[agent_pb2_grpc.AgentStub, tuple[tuple[str, str], ...]]


def as_process(monkeypatch: pytest.MonkeyPatch, agent: AgentRunner, uid: int) -> Stub:
    """A stub and its session token, whose calls the agent sees come from `PID` as `uid`
    (SO_PEERCRED faked; the sockets are the agent's own)."""
    monkeypatch.setattr("agent.node.identity.peer_credentials", lambda sock: (PID, uid, uid))
    channel = grpc.insecure_channel(f"unix:{agent.socket}")
    return agent_pb2_grpc.AgentStub(channel), session_metadata(agent.socket)


def test_a_reused_pid_of_another_user_is_not_the_tenant(
    agent: AgentRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice, metadata = as_process(monkeypatch, agent, ALICE)
    alice.Register(pb.RegisterRequest(name="alice", gpus=["GPU-0"]), metadata=metadata, timeout=10)
    # alice's process exits with no session; another user's process now has its PID
    mallory, metadata = as_process(monkeypatch, agent, MALLORY)
    with pytest.raises(grpc.RpcError) as refused:
        mallory.Acquire(pb.AcquireRequest(gpus=["GPU-0"]), metadata=metadata, timeout=10)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"process {PID} belongs to no tenant" in str(refused.value.details())
    assert agent.status()["gpus"]["GPU-0"]["holder"] is None
    again, metadata = as_process(monkeypatch, agent, ALICE)  # alice's own user: still alice
    lease = again.Acquire(pb.AcquireRequest(gpus=["GPU-0"]), metadata=metadata, timeout=10)
    assert agent.status()["gpus"]["GPU-0"]["holder"] == "local/alice"
    again.Yield(pb.YieldRequest(lease_id=lease.lease_id), metadata=metadata, timeout=10)

"""Property-based fuzzing of every agent RPC's fields over the real socket.

Promised: whatever the fields (empty, huge, negative, unknown ids, another tenant's ids), the
agent answers with a status a client can act on (never UNKNOWN or INTERNAL, never a dropped
server), a refusal changes nothing, and another tenant's turn is never touched.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agent.wire.handshake import handshake_path, request_token
from baton._pb import agent_pb2 as pb
from baton._pb import agent_pb2_grpc
from baton.contract.names import AGENT_SESSION_METADATA
from tests.harness.agent import AgentRunner, TenantProcess

from .figures import record

pytestmark = pytest.mark.timeout(120)
VICTIM_GPU, MY_GPU = "GPU-0", "GPU-1"
REFUSALS = {
    "INVALID_ARGUMENT", "NOT_FOUND", "PERMISSION_DENIED", "FAILED_PRECONDITION",
    "DEADLINE_EXCEEDED", "UNAUTHENTICATED",
    "RESOURCE_EXHAUSTED",  # a session token over gRPC's header size limit
}  # fmt: skip
tried = {"rpcs": 0, "refused": 0}
TOKEN_CHARS = string.ascii_letters + string.digits + "-_"


class Node:
    """The agent, a victim tenant holding GPU-0, and this process registered on GPU-1."""

    def __init__(self) -> None:
        self.agent = AgentRunner().start()
        self.victim = TenantProcess(self.agent.socket, "victim", [VICTIM_GPU])
        self.victim_lease = self.victim.request("acquire")["lease_id"]
        self.channel = grpc.insecure_channel(f"unix:{self.agent.socket}")
        self.stub = agent_pb2_grpc.AgentStub(self.channel)
        self.md = self.token()
        self.stub.Register(pb.RegisterRequest(name="fuzzer", gpus=[MY_GPU]), metadata=self.md)

    def token(self) -> tuple[tuple[str, str], ...]:
        return ((AGENT_SESSION_METADATA, request_token(handshake_path(self.agent.socket))),)

    def state(self) -> Any:
        """Tenants, leases, waiters and tokens: what a refusal must leave as it was."""
        return self.agent.inspect(
            lambda s: (
                sorted(str(t.to_json()) for t in s.tenants.tenants.values()),
                sorted(str(lease) for lease in s.table.leases.values()),
                sorted(w.tenant_id for w in s.table.waiters.values()),
                sorted((g, st.token) for g, st in s.table.gpus.items()),
            )
        )

    def victim_holds(self) -> bool:
        return bool(
            self.agent.inspect(
                lambda s: (
                    s.table.leases.get(self.victim_lease) is not None
                    and s.table.gpus[VICTIM_GPU].holder == self.victim_lease
                )
            )
        )

    def close(self) -> None:
        self.channel.close()
        self.victim.close()
        self.agent.stop()


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    n = Node()
    yield n
    n.close()
    record("bad-input", "agent RPCs", dict(tried))


def with_token(token: str) -> tuple[tuple[str, str], ...]:
    return ((AGENT_SESSION_METADATA, token),)


def code_of(call: Callable[[], Any]) -> str:
    try:
        call()
    except grpc.RpcError as exc:
        return str(exc.code().name)
    return "OK"


texts = st.text(max_size=30) | st.sampled_from(["", "x" * 100_000, "\x00", "../../etc", "local/"])
ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@st.composite
def calls(draw: st.DrawFn, node: Node) -> tuple[str, Callable[[], Any]]:
    lease = draw(texts | st.just(node.victim_lease))
    gpus = draw(st.lists(texts | st.sampled_from([VICTIM_GPU, MY_GPU]), max_size=4))
    tokens = st.text(TOKEN_CHARS, max_size=64) | st.just("x" * 100_000)
    md = node.md if draw(st.booleans()) else draw(st.just(()) | st.builds(with_token, tokens))
    s = node.stub
    options: dict[str, Callable[[], Any]] = {
        "Yield": lambda: s.Yield(pb.YieldRequest(lease_id=lease), metadata=md, timeout=10),
        "Renew": lambda: s.Renew(pb.RenewRequest(lease_id=lease), metadata=md, timeout=10),
        "GetLease": lambda: s.GetLease(pb.GetLeaseRequest(lease_id=lease), metadata=md, timeout=10),
        "Acquire": lambda: s.Acquire(
            pb.AcquireRequest(gpus=gpus, timeout_ms=draw(ints)), metadata=md, timeout=10
        ),
    }
    name = draw(st.sampled_from(sorted(options)))
    return name, options[name]


@given(data=st.data())
@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
def test_fuzzed_turn_rpcs_refuse_cleanly_and_never_touch_anothers_turn(node: Node, data):
    name, call = data.draw(calls(node))
    before = node.state()
    code = code_of(call)
    tried["rpcs"] += 1
    assert code == "OK" or code in REFUSALS, (name, code)
    if code == "OK" and name == "Acquire":  # a turn on our own GPU: give it back
        node.stub.Yield(pb.YieldRequest(), metadata=node.md, timeout=10)
    elif code != "OK":
        tried["refused"] += 1
        assert node.state() == before, (name, code)
    assert node.victim_holds()


@given(
    name=texts,
    gpus=st.lists(texts | st.just(MY_GPU), max_size=3),
    memory=ints,
    duty=st.integers(min_value=-(2**31), max_value=2**31 - 1),
    limit=ints,
)
@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
def test_fuzzed_registrations_are_accepted_or_refused_without_a_trace(
    node: Node, name: str, gpus: list[str], memory: int, duty: int, limit: int
) -> None:
    assume(name != "victim")  # root may join any tenant by name; another UID may not
    md = node.token()
    request = pb.RegisterRequest(
        name=name, gpus=gpus, gpu_memory_mib=memory, gpu_duty=duty, memory_limit_bytes=limit
    )
    before = node.state()
    code = code_of(lambda: node.stub.Register(request, metadata=md, timeout=10))
    tried["rpcs"] += 1
    assert code == "OK" or code in REFUSALS, code
    if code != "OK":
        tried["refused"] += 1
        assert node.state() == before
    assert node.victim_holds()


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"gpu_memory_mib": -5}, "cannot be negative"),
        ({"memory_limit_bytes": -1}, "cannot be negative"),
        ({"gpu_duty": -3}, "gpu_duty -3 is outside 1-100"),
        ({"gpu_duty": 500}, "gpu_duty 500 is outside 1-100"),
        ({"gpus": [""]}, "GPU UUIDs"),
        ({"gpus": [f"GPU-{i}" for i in range(65)]}, "GPU UUIDs"),
        ({"name": "x" * 300}, "printable characters"),
        ({"name": "a\nb"}, "printable characters"),
    ],
)
def test_a_registration_out_of_range_is_invalid_argument_naming_the_field(
    node: Node, fields: dict[str, Any], says: str
) -> None:
    request = pb.RegisterRequest(**{"name": "bad", "gpus": [MY_GPU], **fields})
    before = node.state()
    with pytest.raises(grpc.RpcError) as refused:
        node.stub.Register(request, metadata=node.token(), timeout=10)
    tried["rpcs"] += 1
    tried["refused"] += 1
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in str(refused.value.details())
    assert node.state() == before

"""Who is calling: cgroup parsing, SO_PEERCRED on the handshake socket, session tokens."""

from __future__ import annotations

import asyncio
import logging
import os
import socket as socketlib
from pathlib import Path

import grpc
import pytest

from agent.node import identity
from agent.node.identity import (
    TokenRegistry,
    container_id_from_cgroup,
    pod_uid_from_cgroup,
    pod_uid_of_pid,
    serve_handshake,
)
from agent.wire.handshake import handshake_path, read_token_line, request_token
from baton._pb import agent_pb2 as pb
from baton._pb import agent_pb2_grpc
from tests.harness.agent import AgentRunner

UID = "0b3c6c0e-1a2b-4c5d-8e9f-0123456789ab"


CID = "3f1e2d" * 10 + "abcd"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (f"12:memory:/kubepods/burstable/pod{UID}/{CID}\n", CID),
        (
            "0::/kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n",
            CID,
        ),
        (f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope\n", CID),
        (f"0::/kubepods/besteffort/pod{UID}\n", None),
        (f"0::/user.slice/{CID}\n", None),
        (f"0::/user.slice/user-1000.slice/user@1000.service/kubepods/pod{UID}/{CID}\n", None),
    ],
)
def test_container_id_from_cgroup(text: str, want: str | None) -> None:
    assert container_id_from_cgroup(text) == want


@pytest.mark.parametrize(
    "text",
    [
        # cgroup v1, cgroupfs driver
        f"12:memory:/kubepods/burstable/pod{UID}/3f1e2d\n11:cpu,cpuacct:/kubepods/burstable/pod{UID}/3f1e2d\n",
        # cgroup v1, guaranteed QoS
        f"4:devices:/kubepods/pod{UID}/abcdef0123\n",
        # cgroup v2, systemd driver (underscores in the slice name)
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-0123abcd.scope\n",
        # cgroup v2, cgroupfs driver, besteffort
        f"0::/kubepods/besteffort/pod{UID}/0123abcd\n",
    ],
)
def test_pod_uid_from_cgroup(text: str) -> None:
    assert pod_uid_from_cgroup(text) == UID


@pytest.mark.parametrize(
    "text",
    [
        "0::/user.slice/user-1000.slice/session-2.scope\n",
        "12:memory:/docker/0123456789abcdef\n",
        f"0::/system.slice/pod{UID}.service\n",  # not under kubepods
        # a local user's own (delegated) cgroups, named like a pod's
        "0::/user.slice/user-1000.slice/user@1000.service/kubepods.slice/"
        f"kubepods-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n",
        f"0::/../../user.slice/user-1000.slice/user@1000.service/kubepods/pod{UID}/{CID}\n",
        f"1:name=systemd:/user.slice/user-1000.slice/user@1000.service/kubepods/pod{UID}/x\n",
        "",
    ],
)
def test_no_pod_outside_kubernetes(text: str) -> None:
    assert pod_uid_from_cgroup(text) is None


def test_pod_uid_of_pid_reads_proc(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(f"0::/kubepods/burstable/pod{UID}/c0ffee\n")
    assert pod_uid_of_pid(42, proc=tmp_path) == UID
    assert pod_uid_of_pid(43, proc=tmp_path) is None


def test_handshake_reports_the_callers_pid_uid_gid(tmp_path: Path) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        tokens = TokenRegistry(loop.call_later)
        path = str(tmp_path / "hs.sock")
        server = await serve_handshake(path, tokens, 0o660)
        try:
            assert (os.stat(path).st_mode & 0o777) == 0o660
            first = await asyncio.to_thread(request_token, path)
            second = await asyncio.to_thread(request_token, path)
        finally:
            server.close()
        assert first != second and len(first) >= 32
        peer = tokens.get(first)
        assert peer is not None
        assert (peer.pid, peer.uid, peer.gid) == (os.getpid(), os.getuid(), os.getgid())
        tokens.attach(first)
        tokens.revoke(first)
        assert tokens.get(first) is None and tokens.get("guess") is None

    asyncio.run(scenario())


def test_calls_without_a_valid_token_are_refused(agent: AgentRunner) -> None:
    assert os.path.exists(handshake_path(agent.socket))
    with grpc.insecure_channel(f"unix:{agent.socket}") as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        for metadata in ((), (("baton-session", "forged"),)):
            with pytest.raises(grpc.RpcError) as info:
                stub.Acquire(pb.AcquireRequest(), metadata=metadata, timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "handshake" in (info.value.details() or "")


def test_socket_is_not_world_accessible(agent: AgentRunner) -> None:
    for path in (agent.socket, handshake_path(agent.socket)):
        assert (os.stat(path).st_mode & 0o777) == 0o660


def test_debug_tcp_port_and_bare_rpc_callers(workdir: str) -> None:
    with socketlib.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    runner = AgentRunner(workdir, debug_tcp_port=port, reconnect_grace=0.3).start()
    try:
        token = request_token(handshake_path(runner.socket))
        metadata = (("baton-session", token),)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            request = pb.RegisterRequest(name="tcp", gpus=["GPU-7"])
            tenant = stub.Register(request, metadata=metadata, timeout=5).tenant
            assert tenant.tenant_id == "local/tcp" and list(tenant.gpus) == ["GPU-7"]
            lease = stub.Acquire(pb.AcquireRequest(timeout_ms=1000), metadata=metadata, timeout=5)
            assert lease.fencing_tokens["GPU-7"] == 1
            assert stub.Yield(pb.YieldRequest(lease_id=lease.lease_id), metadata=metadata)
            mark = runner.mark()
            stub.Acquire(pb.AcquireRequest(), metadata=metadata, timeout=5)
        # no session watches this caller: the turn goes after the grace period
        gone = runner.wait_event(lambda e: e.kind == "tenant_gone", timeout=5, since=mark)
        assert gone.tenant_id == "local/tcp" and "without an open session" in gone.detail
        assert runner.status()["gpus"]["GPU-7"]["holder"] is None
    finally:
        runner.stop()


def test_a_user_holding_idle_handshakes_is_refused_more(
    agent: AgentRunner, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A process that opens handshake connections and never writes holds the agent's file
    # descriptors (until EMFILE: then no tenant registers). Its user holds at most
    # MAX_UNSAID_PER_UID of them; more are closed unanswered, with one line in the log.
    monkeypatch.setattr(identity, "MAX_UNSAID_PER_UID", 4, raising=False)
    caplog.set_level(logging.WARNING, logger="agent.node.identity")
    path = handshake_path(agent.socket)

    def connect() -> socketlib.socket:
        sock = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
        sock.settimeout(5)
        sock.connect(path)
        return sock

    idle = [connect() for _ in range(4)]
    try:
        for sock in idle:
            read_token_line(sock)  # answered, then says nothing
        for _ in range(2):
            with connect() as more, pytest.raises(OSError, match="closed before sending"):
                read_token_line(more)
        refused = [m for m in caplog.messages if "handshake of pid" in m]
        assert len(refused) == 1, caplog.messages
        assert f"uid {os.getuid()} holds 4 connections that sent nothing (at most 4)" in refused[0]
        idle[0].shutdown(socketlib.SHUT_WR)  # one says it came for its token only
        assert idle[0].recv(1) == b""  # the agent closed it: it no longer counts
        assert request_token(path)  # so a new one is answered
    finally:
        for sock in idle:
            sock.close()


def test_the_cuda_backend_counts_no_user_slice_process_among_a_pods() -> None:
    """The backend's own lookup of a pod's processes (`procs.names_pod`) follows the same rule:
    a local user's cgroup named like the pod's holds none of the pod's processes."""
    from agent.parking.backends.procs import names_pod

    pod = f"/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope"
    assert names_pod(pod, UID)
    assert not names_pod("/user.slice/user-1000.slice/user@1000.service" + pod, UID)
    assert not names_pod("/../../user.slice/user-1000.slice/user@1000.service" + pod, UID)

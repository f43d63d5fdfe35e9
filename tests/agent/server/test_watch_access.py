"""WatchEvents shows every tenant's turns: it needs the agent's watch token (a file only the
agent's user can read) and the agent's own user or root; UID 0 alone is not enough."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from agent.node.identity import may_watch
from agent.wire.handshake import (
    WatchTokenUnreadable,
    handshake_path,
    request_token,
    session_metadata,
    watch_metadata,
)
from baton._pb import agent_pb2 as pb
from baton._pb import agent_pb2_grpc
from baton.contract import names
from baton.contract.names import AGENT_SESSION_METADATA, AGENT_WATCH_METADATA
from tests.harness.agent import AgentRunner, TenantProcess

NOBODY = 65534


@pytest.fixture
def open_agent(workdir: str) -> Iterator[AgentRunner]:
    os.chmod(workdir, 0o711)  # other users may reach the sockets, as on a node
    runner = AgentRunner(workdir, socket_mode=0o666).start()
    yield runner
    runner.stop()


def first_event(agent: AgentRunner, metadata: tuple[tuple[str, str], ...]) -> pb.Event:
    with grpc.insecure_channel(f"unix:{agent.socket}") as channel:
        stream = agent_pb2_grpc.AgentStub(channel).WatchEvents(
            pb.WatchEventsRequest(), metadata=metadata, timeout=10
        )
        try:
            return next(stream)
        finally:
            stream.cancel()


def token_of_another_user(agent: AgentRunner, monkeypatch: pytest.MonkeyPatch) -> str:
    """A handshake token whose peer is neither the agent's user nor root."""
    if os.getuid() != 0:  # the agent then counts as running under some other user
        monkeypatch.setattr("agent.server.grpc_server.agent_uid", lambda: os.getuid() + 1)
        return request_token(handshake_path(agent.socket))
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child only does the handshake, as UID nobody, and hands the token back
        code = 1
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(5)
                sock.connect(handshake_path(agent.socket))
                os.write(writer, sock.recv(4096))
            code = 0
        finally:
            os._exit(code)
    os.close(writer)
    with os.fdopen(reader, "rb") as pipe:
        line = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the handshake as nobody failed"

    return str(json.loads(line)["token"])


def watch_token(agent: AgentRunner) -> str:
    return (Path(agent.config.state_dir) / names.AGENT_WATCH_TOKEN_FILE).read_text().strip()


def test_the_agents_own_user_with_the_watch_token_may_watch(open_agent: AgentRunner) -> None:
    metadata = watch_metadata(open_agent.socket, open_agent.config.state_dir)
    assert first_event(open_agent, metadata).kind == "watching"


def test_the_watch_token_file_is_readable_by_the_agents_user_only(open_agent: AgentRunner) -> None:
    path = Path(open_agent.config.state_dir) / names.AGENT_WATCH_TOKEN_FILE
    info = path.stat()
    assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.getuid()
    assert len(watch_token(open_agent)) == 64


def test_a_session_token_alone_is_not_enough_even_for_root(open_agent: AgentRunner) -> None:
    """The agent's own user (root here when the suite runs as root) without the watch token."""
    for metadata in (
        session_metadata(open_agent.socket),
        (*session_metadata(open_agent.socket), (AGENT_WATCH_METADATA, "0" * 64)),
    ):
        with pytest.raises(grpc.RpcError) as caught:
            first_event(open_agent, metadata)
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "watch token" in (caught.value.details() or "")


def test_a_new_agent_writes_a_new_watch_token(workdir: str) -> None:
    tokens = []
    for _ in range(2):
        runner = AgentRunner(workdir).start()
        try:
            tokens.append(watch_token(runner))
        finally:
            runner.stop()
    assert tokens[0] != tokens[1]


def test_watch_metadata_says_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(WatchTokenUnreadable, match="cannot read the agent's watch token"):
        watch_metadata(str(tmp_path / "agent.sock"), str(tmp_path / "no-state"))


def test_watching_without_a_handshake_is_refused(open_agent: AgentRunner) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        first_event(open_agent, ())
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_another_user_may_not_watch_even_with_the_watch_token(
    open_agent: AgentRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = token_of_another_user(open_agent, monkeypatch)
    metadata = ((AGENT_SESSION_METADATA, token), (AGENT_WATCH_METADATA, watch_token(open_agent)))
    with pytest.raises(grpc.RpcError) as caught:
        first_event(open_agent, metadata)
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "may not watch" in (caught.value.details() or "")


def test_who_may_watch() -> None:
    assert may_watch(1000, 1000) and may_watch(0, 1000)
    assert not may_watch(1001, 1000)


def test_a_stopping_agent_says_so_in_the_stream_and_then_in_the_status(workdir: str) -> None:
    """The reason is an event the watcher reads before the stream ends (a status can be lost
    as the agent closes its connections); a watcher that reads on, not hanging up, gets the
    status with the same words once the agent stops waiting for it."""
    agent = AgentRunner(workdir, shutdown_grace=20).start()
    metadata = watch_metadata(agent.socket, agent.config.state_dir)
    stopper = threading.Thread(target=agent.stop)
    try:
        with grpc.insecure_channel(f"unix:{agent.socket}") as channel:
            stream = agent_pb2_grpc.AgentStub(channel).WatchEvents(
                pb.WatchEventsRequest(), metadata=metadata, timeout=15
            )
            assert next(stream).kind == "watching"
            stopper.start()
            last = next(stream)
            with pytest.raises(grpc.RpcError) as ended:
                next(stream)
    finally:
        if stopper.is_alive():
            stopper.join(timeout=30)
        agent.stop()
    assert (last.kind, last.detail) == (
        "agent_stopping",
        "the agent is stopping; watch again once it is back",
    )
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
    assert ended.value.details() == last.detail


def test_the_watchs_own_events_are_on_the_agents_clock_after_a_wall_clock_step(
    workdir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wall clock steps an hour forward while the agent runs (NTP, `date`): its events
    keep the agent's steady clock, and so do the watch's first and last, which stay in order
    around them."""
    agent = AgentRunner(workdir).start()
    metadata = watch_metadata(agent.socket, agent.config.state_dir)
    wall = time.time
    monkeypatch.setattr(time, "time", lambda: wall() + 3600)
    stopper = threading.Thread(target=agent.stop)
    tenant = None
    try:
        with grpc.insecure_channel(f"unix:{agent.socket}") as channel:
            stream = agent_pb2_grpc.AgentStub(channel).WatchEvents(
                pb.WatchEventsRequest(), metadata=metadata, timeout=30
            )
            events = [next(stream)]
            tenant = TenantProcess(agent.socket, "a", ["GPU-0"])
            events.append(next(stream))
            stopper.start()
            while events[-1].kind != "agent_stopping":
                events.append(next(stream))
    finally:
        if tenant is not None:
            tenant.close()
        if stopper.is_alive():
            stopper.join(timeout=30)
        agent.stop()
    kinds = [e.kind for e in events]
    assert kinds[0] == "watching" and kinds[1] == "tenant_joined", kinds
    times = [e.at for e in events]
    assert times == sorted(times), list(zip(kinds, times, strict=True))

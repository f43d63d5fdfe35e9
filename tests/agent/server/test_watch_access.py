"""WatchEvents shows every tenant's turns: only the agent's own user and root may watch."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator

import grpc
import pytest

from agent.node.identity import may_watch
from agent.wire.handshake import handshake_path, request_token, session_metadata
from baton._pb import agent_pb2 as pb
from baton._pb import agent_pb2_grpc
from baton.names import AGENT_SESSION_METADATA
from tests.harness.agent import AgentRunner

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


def test_the_agents_own_user_may_watch(open_agent: AgentRunner) -> None:
    assert first_event(open_agent, session_metadata(open_agent.socket)).kind == "watching"


def test_watching_without_a_handshake_is_refused(open_agent: AgentRunner) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        first_event(open_agent, ())
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_another_user_may_not_watch(
    open_agent: AgentRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = token_of_another_user(open_agent, monkeypatch)
    with pytest.raises(grpc.RpcError) as caught:
        first_event(open_agent, ((AGENT_SESSION_METADATA, token),))
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "may not watch" in (caught.value.details() or "")


def test_who_may_watch() -> None:
    assert may_watch(1000, 1000) and may_watch(0, 1000)
    assert not may_watch(1001, 1000)

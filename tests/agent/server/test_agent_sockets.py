"""The agent's unix sockets on the host: a second agent given a live agent's socket is refused at
start and takes nothing from it, its failed start's stop included; a stale socket a crashed agent
left is taken over; a socket path too long to bind is refused at start."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from agent.assembly import AgentStartError
from agent.client import Baton
from agent.wire.handshake import handshake_path
from tests.harness.agent import AgentRunner, short_tmpdir

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def second_workdir() -> Iterator[str]:
    import shutil

    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def on_socket(workdir: str, path: str) -> AgentRunner:
    """An agent of its own state directory, serving on `path`."""
    runner = AgentRunner(workdir)
    runner.config = dataclasses.replace(runner.config, socket=path)
    return runner


def inodes(path: str) -> tuple[int, int]:
    return os.stat(path).st_ino, os.stat(handshake_path(path)).st_ino


def serves(path: str) -> bool:
    with Baton(path, ["GPU-0"], name="probe") as tenant:
        tenant.acquire(10)
        tenant.yield_()
    return True


def test_a_second_agent_on_a_live_agents_socket_is_refused_and_takes_nothing(
    agent: AgentRunner, second_workdir: str
) -> None:
    """It unlinked the live agent's sockets and bound its own in their place (the first agent's
    tenants could no longer connect); a failed start's stop then removed them too."""
    before = inodes(agent.socket)
    second = on_socket(second_workdir, agent.socket)
    try:
        with pytest.raises(AgentStartError) as refused:
            second.start()
    finally:
        second.stop()
    assert str(refused.value) == (
        f"another process serves the socket {agent.socket} (a second agent?): stop it, or pass "
        "another --socket"
    )
    assert inodes(agent.socket) == before
    assert agent.http("/readyz") == (200, "ready\n") and serves(agent.socket)


def test_a_stale_socket_left_by_a_crashed_agent_is_taken_over(workdir: str) -> None:
    runner = AgentRunner(workdir)
    for path in (runner.socket, handshake_path(runner.socket)):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as left:
            left.bind(path)  # bound, never accepting: what a killed agent leaves
    runner.start()
    try:
        assert serves(runner.socket)
    finally:
        runner.stop()
    assert not os.path.exists(runner.socket) and not os.path.exists(handshake_path(runner.socket))


def test_an_agent_stopping_after_a_new_agent_replaced_its_sockets_leaves_the_new_ones(
    agent: AgentRunner, second_workdir: str
) -> None:
    """A rolling restart whose old agent's sockets were deleted on the host: the new agent binds
    the same paths; the old one stopping removed the new agent's --socket (gRPC removes the path
    it bound), and the new agent's tenants could no longer connect."""
    for path in (agent.socket, handshake_path(agent.socket)):
        os.unlink(path)
    second = on_socket(second_workdir, agent.socket).start()
    try:
        made = inodes(agent.socket)
        agent.stop()
        assert inodes(agent.socket) == made
        assert second.http("/readyz") == (200, "ready\n") and serves(agent.socket)
    finally:
        second.stop()
    assert not os.path.exists(agent.socket) and not os.path.exists(handshake_path(agent.socket))
    left = [n for n in os.listdir(os.path.dirname(agent.socket)) if n.startswith(".")]
    assert left == [], "no private socket left"


def socket_of_length(workdir: str, name: str, length: int) -> str:
    """A path of `length` bytes in a directory of its own under `workdir`, ending in `name`."""
    path = os.path.join(workdir, "d" * (length - len(workdir) - len(name) - 2), name)
    assert len(path) == length
    return path


@pytest.mark.parametrize(
    ("name", "most", "why"),
    [
        ("s", 100, "the private name it is bound under first is 7 bytes longer"),
        ("ab", 101, "the private name it is bound under first is 6 bytes longer"),
        ("agent.sock", 102, "its handshake socket {path}.auth is 5 bytes longer"),
    ],
    ids=["one-byte-name", "two-byte-name", "agent.sock"],
)
def test_every_socket_the_length_check_takes_binds_and_one_byte_more_is_refused_naming_it(
    second_workdir: str, name: str, most: int, why: str
) -> None:
    """The agent binds a socket under a private name as long as its name but of at least 8
    bytes (renamed into place), and its handshake socket 5 bytes longer: a --socket with a
    one-byte name of 101 bytes passed the check, then failed to bind ('cannot listen on ...
    (AF_UNIX path too long)'), naming neither its length nor the most it may have."""
    fits = socket_of_length(second_workdir, name, most)
    runner = on_socket(second_workdir, fits)
    try:
        runner.start()
        assert serves(fits)
    finally:
        runner.stop()
    assert os.listdir(os.path.dirname(fits)) == [], "no socket left, private or not"
    path = socket_of_length(second_workdir, name, most + 1)
    runner = on_socket(second_workdir, path)
    try:
        with pytest.raises(AgentStartError) as refused:
            runner.start()
    finally:
        runner.stop()
    assert str(refused.value) == (
        f"the socket {path} is {most + 1} bytes, over the {most} it may have: "
        f"{why.format(path=path)}, and a unix socket's path has at most 107 bytes: pass a "
        "shorter --socket (BATON_AGENT_SOCKET)"
    )
    assert not os.path.exists(os.path.dirname(path)), "nothing made"


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A TCP port another socket listens on (not shared: no SO_REUSEPORT)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


@pytest.mark.parametrize(
    ("option", "setting"),
    [("--debug-tcp-port", "debug_tcp_port"), ("--llmd-listen", "llmd_listen")],
)
def test_a_tcp_port_in_use_is_refused_at_start_saying_why(
    workdir: str, busy_port: int, option: str, setting: str
) -> None:
    """gRPC says only that it failed ('cannot listen on 127.0.0.1:N; check --debug-tcp-port'),
    its reason in a log line of its own."""
    runner = AgentRunner(workdir)
    value = busy_port if setting == "debug_tcp_port" else f"127.0.0.1:{busy_port}"
    changes: dict[str, Any] = {setting: value}
    runner.config = dataclasses.replace(runner.config, **changes)
    try:
        with pytest.raises(Exception) as refused:
            runner.start()
    finally:
        runner.stop()
    said = str(refused.value)
    assert f"127.0.0.1:{busy_port}" in said and option in said
    assert "(Address already in use)" in said


def test_the_start_lines_name_the_ports_bound_for_port_0(
    workdir: str, caplog: pytest.LogCaptureFixture
) -> None:
    """`--llmd-listen 127.0.0.1:0` and `--coordination-listen 127.0.0.1:0` log the ports the
    kernel gave, those a client reaches, not :0."""
    runner = AgentRunner(
        workdir,
        llmd_listen="127.0.0.1:0",
        llmd_groups=("jobs=GPU-0",),
        coordination_listen="127.0.0.1:0",
        coordination_token="t" * 32,
    )
    with caplog.at_level(logging.INFO), runner:
        assert runner.agent.coordination is not None
        ports = (runner.llmd_port, runner.agent.coordination.port)
    assert 0 not in ports
    said = caplog.text
    assert f"llm-d API on 127.0.0.1:{ports[0]} " in said, said
    assert f"job turns for the coordinator on 127.0.0.1:{ports[1]} " in said, said

"""The agent remembers which process is behind each llm-d connection only while that process
lives: callers come and go for months (a status poller, a job's short-lived tools), each from
new ports, and a port an exited process used may later be another process's."""

from __future__ import annotations

import os
import select
import socket
import struct
import subprocess
import sys
from pathlib import Path

from commands.localnode.procs import wait_for
from tests.agent.server.llmd.agents import one_group_agent
from tests.agent.server.llmd.llmd_client import TimeSliceOrchestratorClient

ROOT = Path(__file__).resolve().parents[4]
PROCESSES, CONNECTIONS = 4, 20


def test_callers_that_exited_are_forgotten_and_a_live_one_is_kept(workdir: str) -> None:
    agent = one_group_agent(workdir, "fake")
    target = f"127.0.0.1:{agent.llmd_port}"
    live = TimeSliceOrchestratorClient(target)
    jobs = agent.agent.llmd.jobs if agent.agent.llmd is not None else None
    assert jobs is not None

    def callers() -> int:
        return agent.inspect(lambda s: len(jobs._callers.known))

    try:
        assert live.list_groups() == ["g"]
        for _ in range(PROCESSES):  # 80 connections, each from a port of its own
            subprocess.run(
                [sys.executable, "-m", "tests.agent.server.llmd.status_process", target,
                 str(CONNECTIONS)],
                cwd=ROOT,
                check=True,
                timeout=60,
            )  # fmt: skip
        wait_for(
            "the callers of exited processes to be forgotten",
            lambda: True if callers() == 1 else None,
            10,
            every=0.02,
        )
        assert live.list_groups() == ["g"]
        assert callers() == 1, "the live caller's connection is remembered once"
    finally:
        live.close()
        agent.stop()


HOLDER = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.connect(("127.0.0.1", int(sys.argv[2])))
print("connected", flush=True)
sys.stdin.read()
"""
"""A process that connects from the port it is given and holds the connection until its stdin
closes."""


def test_a_port_another_process_connects_from_while_the_first_lives_is_the_new_ones(
    workdir: str,
) -> None:
    """This process called from a port, closed that connection and lives on; another process
    (another pod's, say) connects from the same port: its calls are its own, not taken for this
    process's (whose pod, or whose whole-host view, they would get)."""
    agent = one_group_agent(workdir, "fake")
    jobs = agent.agent.llmd.jobs if agent.agent.llmd is not None else None
    assert jobs is not None
    first = socket.socket()
    first.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    first.bind(("127.0.0.1", 0))
    port = first.getsockname()[1]
    peer = f"ipv4:127.0.0.1:{port}"
    holder = None
    try:
        first.connect(("127.0.0.1", agent.llmd_port))
        found = agent.call(jobs.caller(peer))
        assert found is not None and found.pid == os.getpid()
        first.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        first.close()  # reset: the port is free at once (no TIME_WAIT)
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(port), str(agent.llmd_port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout is not None
        ready, _, _ = select.select([holder.stdout], [], [], 10)
        assert ready and holder.stdout.readline().strip() == "connected"
        found = agent.call(jobs.caller(peer))
        assert found is not None and found.pid == holder.pid, "taken for the port's last caller"
    finally:
        first.close()
        if holder is not None:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait(10)
        agent.stop()

"""The agent remembers which process is behind each llm-d connection only while that process
lives: callers come and go for months (a status poller, a job's short-lived tools), each from
new ports, and a port an exited process used may later be another process's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from commands.localnode.procs import wait_for
from tests.agent.server.llmd.agents import one_group_agent
from tests.agent.server.llmd.llmd_client import TimeSliceOrchestratorClient

ROOT = Path(__file__).resolve().parents[4]
PROCESSES, CONNECTIONS = 6, 50


def test_callers_that_exited_are_forgotten_and_a_live_one_is_kept(workdir: str) -> None:
    agent = one_group_agent(workdir, "fake")
    target = f"127.0.0.1:{agent.llmd_port}"
    live = TimeSliceOrchestratorClient(target)
    jobs = agent.agent.llmd.jobs if agent.agent.llmd is not None else None
    assert jobs is not None

    def callers() -> int:
        return agent.inspect(lambda s: len(jobs._callers))

    try:
        assert live.list_groups() == ["g"]
        for _ in range(PROCESSES):  # 300 connections, each from a port of its own
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

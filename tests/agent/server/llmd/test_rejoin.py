"""An llm-d job that leaves (its last process exited) and registers again under the same job id
before the agent has dropped what it kept of the one that left (`forget` waits for the parking
lock behind a move): the new registration starts from nothing of the old one's."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from agent.core import events as ev
from agent.server.llmd.jobs import ProcessSession
from baton._pb import snapshot_agent_pb2 as sa
from commands.localnode.procs import wait_for
from tests.agent.server.llmd.agents import one_group_agent
from tests.agent.server.llmd.llmd_client import SnapshotAgentClient, register_workload
from tests.harness.agent import AgentRunner

ROOT = Path(__file__).resolve().parents[4]
JOB = "llmd/run"


def _channel_open(agent: AgentRunner) -> bool | None:
    """Whether the job's WorkloadChannel is open (None if not, for `wait_for`)."""
    return agent.inspect(lambda s: s.sessions.connected_besides(JOB, ProcessSession)) or None


def test_a_job_registered_again_while_its_old_self_is_forgotten_is_told_to_snapshot(
    workdir: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The old job's memory was parked (its process offloaded it, then exited). Registered again
    before that record was dropped, the new workload was taken for snapshotted: its next
    Snapshot was answered without a command, its memory counted parked while on the GPU.
    It now waits until the old one is forgotten (logged), then registers as new."""
    caplog.set_level(logging.INFO, logger="agent.server.tenancy")
    agent = one_group_agent(workdir, "app")
    target = f"127.0.0.1:{agent.llmd_port}"
    snapshots = SnapshotAgentClient(target)
    old = subprocess.Popen(
        [sys.executable, "-m", "tests.agent.server.llmd.workload_process", target, "run", "g"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        text=True,
    )
    workload = None
    lock = agent.service.preparer._lock  # type: ignore[attr-defined]
    held = False
    try:
        wait_for("the old workload's channel", lambda: _channel_open(agent), 10, every=0.01)
        op = snapshots.wait_for_operation(snapshots.snapshot("run", "g"), 0.01)
        assert op.status == sa.OPERATION_STATUS_COMPLETE, op.error
        agent.call(lock.acquire())  # a move of another job runs: the old job's forget waits
        held = True
        mark = agent.mark()
        old.kill()
        old.wait(10)
        agent.wait_event(lambda e: e.kind == ev.TENANT_GONE and e.tenant_id == JOB, since=mark)
        workload = register_workload(target, "run", "g")

        def arrived() -> bool | None:  # registered at once, or waiting for the forget
            waits = any("its departed namesake" in r.getMessage() for r in caplog.records)
            return waits or _channel_open(agent)

        wait_for("the new workload's registration to reach the agent", arrived, 10, every=0.01)
        agent.inspect(lambda s: lock.release())
        held = False
        wait_for("the new workload's channel", lambda: _channel_open(agent), 10, every=0.01)
        op = snapshots.wait_for_operation(snapshots.snapshot("run", "g"), 0.01)
        assert op.status == sa.OPERATION_STATUS_COMPLETE, op.error
        kinds = [c.WhichOneof("command") for c in workload.commands]
        assert kinds == ["snapshot"], f"the new workload was told {kinds}, not to snapshot"
    finally:
        if held:
            agent.inspect(lambda s: lock.release())
        if workload is not None:
            workload.close()
        old.kill()
        old.wait(10)
        assert old.stdin is not None
        old.stdin.close()
        snapshots.close()
        agent.stop()

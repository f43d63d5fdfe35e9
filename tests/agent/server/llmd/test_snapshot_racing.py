"""llm-d's Snapshot racing what happens to its job: the holder's Acquire while the Snapshot is
still choosing its method, and the job leaving the node before the Snapshot's move begins.
The test holds the residency layer's lock to stop each call where the race is."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures

import pytest

from baton._pb import snapshot_agent_pb2 as sa
from tests.agent.server.llmd.llmd_client import (
    SnapshotAgentClient,
    TimeSliceOrchestratorClient,
    register_workload,
)
from tests.agent.server.llmd.test_snapshot_agent import Workload, _registered, llmd_agent
from tests.harness.agent import AgentRunner

WAIT_S = 10.0


@pytest.fixture
def agent(workdir: str) -> Iterator[AgentRunner]:
    """One GPU, group `g`; two methods, so a BackendConfig pins one (under the lock)."""
    runner = llmd_agent(workdir, "app,fake")
    yield runner
    runner.stop()


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(2) as executor:
        yield executor


def _lock(agent: AgentRunner) -> asyncio.Lock:
    lock: asyncio.Lock = agent.service.preparer._lock  # type: ignore[attr-defined]
    return lock


def test_the_holders_acquire_waits_for_a_snapshot_still_choosing_its_method(
    agent: AgentRunner, pool: ThreadPoolExecutor
) -> None:
    """The Snapshot had no operation yet (it waited to pin `app_channel`): Acquire answered at
    once, context loaded, and the Snapshot then parked the job in its turn."""
    endpoint = f"127.0.0.1:{agent.llmd_port}"
    engine = Workload()
    channel = register_workload(endpoint, "a", "g", engine.on_snapshot, engine.on_restore)
    client = SnapshotAgentClient(endpoint)
    holder = TimeSliceOrchestratorClient(endpoint, "a", "g")
    lock = _lock(agent)
    held = False
    snapped: Future[str] | None = None
    acquired: Future[tuple[bool, int, bool]] | None = None
    try:
        _registered(client, "a")
        assert holder.acquire(timeout_sec=WAIT_S)[0]
        agent.call(lock.acquire())
        held = True
        config = sa.BackendConfig(app_channel=sa.AppChannelConfig())
        snapped = pool.submit(client.snapshot, "a", "g", config)
        agent.wait_queued_on(lock, "the Snapshot's pin to wait for the lock", WAIT_S)
        acquired = pool.submit(holder.acquire, timeout_sec=WAIT_S)
        done, _ = wait_futures([acquired], timeout=1)
        assert not done, f"answered {acquired.result()} before the Snapshot under way ended"
        agent.inspect(lambda s: lock.release())
        held = False
        op = client.wait_for_operation(snapped.result(WAIT_S), 0.01)
        assert op.status == sa.OPERATION_STATUS_COMPLETE, op.error
        assert acquired.result(WAIT_S) == (True, 0, True), "its context came back"
        assert engine.device is not None, "the holder was told its context was loaded"
    finally:
        if held:
            agent.inspect(lambda s: lock.release())
        for future in (snapped, acquired):
            if future is not None:
                future.exception(WAIT_S)
        client.close()
        holder.close()
        channel.close()


def test_a_snapshot_of_a_job_that_left_before_its_move_says_so(agent: AgentRunner) -> None:
    """The job left between the Snapshot's checks and its move: the operation reported COMPLETE,
    0 bytes, for memory nobody parked."""
    endpoint = f"127.0.0.1:{agent.llmd_port}"
    engine = Workload()
    channel = register_workload(endpoint, "a", "g", engine.on_snapshot, engine.on_restore)
    client = SnapshotAgentClient(endpoint)
    lock = _lock(agent)
    held = False
    try:
        _registered(client, "a")
        agent.call(lock.acquire())
        held = True
        op_id = client.snapshot("a", "g")
        agent.wait_queued_on(lock, "the Snapshot's park to wait for the lock", WAIT_S)
        agent.inspect(lambda s: s.left("llmd/a", "its callers went quiet"))
        agent.inspect(lambda s: lock.release())
        held = False
        op = client.wait_for_operation(op_id, 0.01)
        assert op.status == sa.OPERATION_STATUS_FAILED, f"{sa.OperationStatus.Name(op.status)}"
        assert "left the node" in op.error
        assert engine.modes == [], "nothing was parked"
    finally:
        if held:
            agent.inspect(lambda s: lock.release())
        client.close()
        channel.close()

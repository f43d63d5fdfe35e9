"""llm-d's calls while a job's memory is on the move, over the real port: the agent's own park
of it for another job's turn reads TRANSITIONING and refuses Snapshot and Restore with ABORTED
(llm-d's "try again"), and the holder's Acquire during its own Snapshot returns with its context
loaded."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures

import grpc
import pytest

from baton._pb import snapshot_agent_pb2 as sa
from baton._pb import timeslice_orchestrator_pb2 as ts
from tests.agent.server.llmd.llmd_client import (
    SnapshotAgentClient,
    TimeSliceOrchestratorClient,
    register_workload,
)
from tests.agent.server.llmd.test_snapshot_agent import (  # noqa: F401 (fixtures)
    Workload,
    _registered,
    _state,
    agent,
    endpoint,
)


class HeldWorkload(Workload):
    """A workload whose snapshot says when it has begun, and ends only once let go."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()

    def on_snapshot(self, mode: int, tags: list[str]) -> None:
        self.entered.set()
        super().on_snapshot(mode, tags)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(1) as executor:
        yield executor


def _code(call: Callable[[], object]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        call()
    code: grpc.StatusCode = err.value.code()
    return code


def test_a_job_parked_for_another_jobs_turn_is_transitioning_and_asked_to_retry(
    endpoint: str,  # noqa: F811
    pool: ThreadPoolExecutor,
) -> None:
    """The agent's own park read RUNNING until it ended: Restore answered FAILED_PRECONDITION
    ("not SAVED"), which llm-d's orchestrator takes for a failure, where its contract answers
    ABORTED while the job is transitioning, which it retries."""
    engine, trainer_engine = HeldWorkload(), Workload()
    channels = [
        register_workload(endpoint, job, "g", w.on_snapshot, w.on_restore)
        for job, w in (("engine", engine), ("trainer", trainer_engine))
    ]
    client = SnapshotAgentClient(endpoint)
    trainer = TimeSliceOrchestratorClient(endpoint, "trainer", "g")
    acquired: Future[tuple[bool, int, bool]] | None = None
    try:
        _registered(client, "engine")
        _registered(client, "trainer")
        engine.gate.clear()
        acquired = pool.submit(trainer.acquire, timeout_sec=10)
        assert engine.entered.wait(10), "the trainer's turn never parked the engine"
        assert _state(client, "engine") == "JOB_STATE_TRANSITIONING"
        states = {s.job_id: s.job_state for s in trainer.get_status().agent_job_states}
        assert states["engine"] == ts.SnapshotAgentJobState.STATE_TRANSITIONING
        assert _code(lambda: client.restore("engine", "g")) == grpc.StatusCode.ABORTED
        assert _code(lambda: client.snapshot("engine", "g")) == grpc.StatusCode.ABORTED
        engine.gate.set()
        assert acquired.result(10)[0]
        assert engine.device is None and _state(client, "engine") == "JOB_STATE_SAVED"
    finally:
        engine.gate.set()
        if acquired is not None:
            acquired.result(10)
        for c in (client, trainer):
            c.close()
        for channel in channels:
            channel.close()


def test_the_holders_acquire_during_its_own_snapshot_waits_and_restores_it(
    endpoint: str,  # noqa: F811
    pool: ThreadPoolExecutor,
) -> None:
    """It answered at once, context_restored false, while the Snapshot went on to park the
    memory of the job that had just been told its context was loaded."""
    engine = HeldWorkload()
    channel = register_workload(endpoint, "a", "g", engine.on_snapshot, engine.on_restore)
    client = SnapshotAgentClient(endpoint)
    holder = TimeSliceOrchestratorClient(endpoint, "a", "g")
    acquired: Future[tuple[bool, int, bool]] | None = None
    try:
        _registered(client, "a")
        assert holder.acquire(timeout_sec=10)[0]
        engine.gate.clear()
        op = client.snapshot("a", "g")
        assert engine.entered.wait(10), "the snapshot never began"
        acquired = pool.submit(holder.acquire, timeout_sec=10)
        done, _ = wait_futures([acquired], timeout=1)
        assert not done, f"answered {acquired.result()} while its snapshot was under way"
        engine.gate.set()
        assert acquired.result(10) == (True, 0, True), "its context came back"
        assert client.wait_for_operation(op, 0.01).status == sa.OPERATION_STATUS_COMPLETE
        assert engine.device is not None and _state(client, "a") == "JOB_STATE_RUNNING"
    finally:
        engine.gate.set()
        if acquired is not None:
            acquired.result(10)
        client.close()
        holder.close()
        channel.close()

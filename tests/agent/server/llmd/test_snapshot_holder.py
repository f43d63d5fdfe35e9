"""llm-d's Snapshot of a job in its turn (it holds the group's GPUs) that fails: the job keeps
its turn and its memory resident through it."""

from __future__ import annotations

from baton._pb import snapshot_agent_pb2 as sa
from tests.agent.server.llmd import test_snapshot_agent as harness
from tests.agent.server.llmd.test_snapshot_agent import _jobs_a_and_b, _state

agent, endpoint = harness.agent, harness.endpoint  # its fixtures: an agent with one GPU


def test_a_holder_whose_snapshot_failed_is_not_parked_by_another_jobs_restore(
    endpoint: str,
) -> None:
    """A Snapshot of the holder took it off the preparer's holders before it moved anything,
    and its failure did not put it back: another job's Restore then parked it in its turn."""
    with _jobs_a_and_b(endpoint) as (a_engine, b_engine, client, holder):
        assert holder.acquire(timeout_sec=10)[0] and b_engine.device is None
        a_engine.fail = "out of host memory"
        op = client.wait_for_operation(client.snapshot("a", "g"), 0.01)
        assert op.status == sa.OPERATION_STATUS_FAILED and "out of host memory" in op.error
        a_engine.fail = ""
        assert a_engine.device is not None and _state(client, "a") == "JOB_STATE_RUNNING"
        op = client.wait_for_operation(client.restore("b", "g"), 0.01)
        assert op.status == sa.OPERATION_STATUS_FAILED, "a still holds the GPU"
        assert "holds a turn" in op.error
        assert a_engine.device is not None and b_engine.device is None

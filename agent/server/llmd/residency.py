"""llm-d jobs' memory in llm-d's terms (where it is: `agent.core.residency`)."""

from __future__ import annotations

from agent.core.residency import TurnPreparer
from baton._pb import snapshot_agent_pb2 as sa


def bytes_of(preparer: TurnPreparer, tenant_id: str) -> tuple[int, int]:
    """(parked bytes in host memory, device footprint bytes) of one tenant."""
    entry = preparer.status().get("tenants", {}).get(tenant_id, {})
    return int(entry.get("parked_bytes", 0)), int(entry.get("footprint_bytes", 0))


def job_state(gpus: dict[str, str], moving: bool, parks: bool) -> sa.JobState:
    """A job's `JobState`: TRANSITIONING while moving, SAVED when parked, else RUNNING.

    Without a parking backend (`parks` false) every job is RUNNING: nothing is ever parked.
    """
    if moving or any(r in ("parking", "restoring") for r in gpus.values()):
        return sa.JOB_STATE_TRANSITIONING
    if parks and gpus and all(r == "parked" for r in gpus.values()):
        return sa.JOB_STATE_SAVED
    return sa.JOB_STATE_RUNNING

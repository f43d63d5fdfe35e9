"""The fair clocks a leader carries on its Lease stay within what the API server takes for a
Lease's annotations, however many jobs the cluster has seen (real kube-apiserver)."""

from __future__ import annotations

import threading
import time
import uuid

from commands.localnode.controlplane import ControlPlane
from tests.coordinator.test_leader import (
    FAST,
    WAIT_S,
    Campaign,
    campaign,
    lease_name,
    read_lease_object,
    someone_leads,
)

__all__ = ["campaign", "lease_name", "someone_leads"]  # the fixtures, used by name


def test_a_leader_keeps_its_lease_however_many_jobs_its_fair_clocks_have_seen(
    campaign: Campaign, control_plane: ControlPlane, lease_name: str
) -> None:
    """The fair clocks ride on the Lease's renewals; a cluster that has seen thousands of jobs
    (each RL run its own job id) must not grow them past what the API server takes for a
    Lease's annotations (256 KiB), or every renewal is refused and leadership flaps."""
    from agent.core.fair import FairShare
    from agent.core.leases import LeaseTable
    from baton.contract.names import ANNOTATION_FAIR_CLOCKS
    from coordinator import fairstate

    table = LeaseTable(clock=time.time, policy=FairShare())
    assert table.fair is not None
    for i in range(8000):  # jobs that held their turns once and are gone
        table.fair.vtime[f"team/rl-run-{uuid.uuid4().hex[:12]}"] = 1000.0 + i / 7
    table.fair.vclock.update({f"node-{n}/GPU-{g}": 9000.0 + n for n in range(64) for g in range(8)})
    heavy = "team/still-here"
    table.fair.vtime[heavy] = 99_999.0  # well ahead: forgetting it would serve it first again
    carried = {ANNOTATION_FAIR_CLOCKS: fairstate.dump(table)}
    a = campaign("a", annotate=lambda: carried, **FAST)
    assert a.it.wait_leading(WAIT_S)
    deadline = time.monotonic() + WAIT_S
    lease = read_lease_object(control_plane, lease_name)
    while time.monotonic() < deadline and not a.stopped.is_set():  # bounded
        lease = read_lease_object(control_plane, lease_name)
        if lease["metadata"].get("annotations", {}) == carried:
            break
        threading.Event().wait(0.05)
    assert not a.reasons, f"the leader lost its Lease: {a.reasons}"
    assert lease["metadata"].get("annotations", {}) == carried
    new = LeaseTable(clock=time.time, policy=FairShare())
    assert fairstate.load(new, carried[ANNOTATION_FAIR_CLOCKS])
    assert new.fair is not None and new.fair.vtime[heavy] == 99_999.0
    assert new.fair.vclock == table.fair.vclock

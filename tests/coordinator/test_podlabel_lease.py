"""The leader's label and the Lease it leads by: a label left from a Lease deleted since (whose
epochs may be higher than the new Lease's) goes; a deposed leader sweeps nothing; the leader's
own label, removed by someone else, comes back while it leads (a real kube-apiserver)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from baton.contract.names import ANNOTATION_COORDINATOR_LEADER_LEASE, LABEL_COORDINATOR_LEADER
from commands.localnode.controlplane import ControlPlane
from commands.localnode.procs import wait_for
from coordinator import podlabel
from coordinator.daemon import Coordinator
from coordinator.lease import LeaseRecord, lease_object
from tests.coordinator.conftest import LEASE_NS, TEAM
from tests.coordinator.test_podlabel import WAIT_S, coordinator_pod, leader_of, leading


def client_leases(core: Any) -> Any:
    from kubernetes import client

    return client.CoordinationV1Api(core.api_client)


def test_a_label_left_from_a_deleted_lease_goes_though_its_epoch_is_higher(
    control_plane: ControlPlane, core: Any
) -> None:
    """The leader of epoch 7 was frozen (or cut off) with its pod labelled; the Lease was deleted
    meanwhile, and no agent heard of epoch 7 (there were no jobs). The new leader creates the
    Lease again in epoch 1: the old label, of another Lease, goes, or the Service would send
    callers to both (half of them to hang until their deadline)."""
    app = {"app.kubernetes.io/name": f"coordinator-{uuid.uuid4().hex[:8]}"}
    own, deposed = (f"{app['app.kubernetes.io/name']}-{suffix}" for suffix in ("own", "deposed"))
    lease = f"recreated-{uuid.uuid4().hex[:8]}"
    leases = client_leases(core)
    held = LeaseRecord("the-frozen-replica", 15, time.time(), time.time(), transitions=7)
    old = leases.create_namespaced_lease(
        LEASE_NS, lease_object(held, {"metadata": {"name": lease}})
    )
    leases.delete_namespaced_lease(lease, LEASE_NS)
    coordinator_pod(core, own, app)
    coordinator_pod(core, deposed, app, epoch=7, lease=old.metadata.uid)

    async def during(coordinator: Coordinator) -> None:
        await asyncio.to_thread(
            wait_for,
            "the label of the deleted Lease's leader removed",
            lambda: True if leader_of(core, deposed) is None else None,
            WAIT_S,
        )
        assert coordinator.arbiter.epoch == 1 and leader_of(core, own) == "1"

    try:
        leading(control_plane, core, own, lease, during)
    finally:
        for pod in (own, deposed):
            core.delete_namespaced_pod(pod, TEAM, grace_period_seconds=0)
        leases.delete_namespaced_lease(lease, LEASE_NS)


def test_a_deposed_leader_sweeps_nothing(core: Any) -> None:
    """A leader frozen while the Lease was deleted and created again sweeps as it wakes up,
    before it notices: the Lease no longer records its term, so the new leader's label (of
    another Lease) stays, and its own label, which the new leader removed, is not written again."""
    app = {"app.kubernetes.io/name": f"coordinator-{uuid.uuid4().hex[:8]}"}
    own, new = (f"{app['app.kubernetes.io/name']}-{suffix}" for suffix in ("own", "new"))
    coordinator_pod(core, own, app)
    coordinator_pod(core, new, app, epoch=1, lease="the-new-lease")
    asked: list[podlabel.Term] = []

    def holds(term: podlabel.Term) -> bool:
        asked.append(term)
        return False

    try:
        term = podlabel.Term(7, "the-deleted-lease")
        assert podlabel.sweep(core, TEAM, own, term, holds) == []
        assert asked == [term] and leader_of(core, new) == "1" and leader_of(core, own) is None
    finally:
        for pod in (own, new):
            core.delete_namespaced_pod(pod, TEAM, grace_period_seconds=0)


def test_the_leaders_own_label_removed_by_someone_else_comes_back(
    control_plane: ControlPlane, core: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator removes the leader's label (`kubectl label pod NAME
    baton.dev/coordinator-leader-`): the Service has no endpoint and callers hang until their
    deadline. The leader, sweeping again while it leads, labels its pod again."""
    monkeypatch.setattr(podlabel, "RESWEEP_S", 0.2)
    app = {"app.kubernetes.io/name": f"coordinator-{uuid.uuid4().hex[:8]}"}
    own = f"{app['app.kubernetes.io/name']}-own"
    lease = f"free-{uuid.uuid4().hex[:8]}"
    coordinator_pod(core, own, app)
    path = "/metadata/labels/" + LABEL_COORDINATOR_LEADER.replace("/", "~1")

    async def during(coordinator: Coordinator) -> None:
        epoch = leader_of(core, own)
        await asyncio.to_thread(
            core.patch_namespaced_pod,
            own,
            TEAM,
            [{"op": "remove", "path": path}],
            _content_type="application/json-patch+json",
        )
        await asyncio.to_thread(
            wait_for,
            "the leader's label written again",
            lambda: True if leader_of(core, own) is not None else None,
            WAIT_S,
        )
        assert leader_of(core, own) == epoch == str(coordinator.arbiter.epoch)
        annotations = core.read_namespaced_pod(own, TEAM).metadata.annotations
        assert annotations[ANNOTATION_COORDINATOR_LEADER_LEASE]

    try:
        leading(control_plane, core, own, lease, during)
        assert leader_of(core, own) is None
    finally:
        core.delete_namespaced_pod(own, TEAM, grace_period_seconds=0)
        client_leases(core).delete_namespaced_lease(lease, LEASE_NS)

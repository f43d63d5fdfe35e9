"""The leader's label on its own pod (which the Service selects): removed by a replica that does
not lead, also one restarted in a pod a crashed leader had labelled; the last wish wins."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

import pytest

from baton.contract.kube import load_api_client
from baton.contract.names import LABEL_COORDINATOR_LEADER
from commands.localnode.controlplane import ControlPlane
from commands.localnode.procs import wait_for
from coordinator import podlabel
from coordinator.daemon import Coordinator, CoordinatorConfig
from coordinator.lease import LeaseRecord, lease_object
from coordinator.podlabel import LeaderLabel
from tests.coordinator.conftest import LEASE_NS, TEAM
from tests.harness.agent import http_get

WAIT_S = 10.0


def test_a_replica_restarted_in_a_pod_its_crashed_leader_labelled_removes_the_label(
    control_plane: ControlPlane, core: Any
) -> None:
    from kubernetes import client

    pod, lease = f"coordinator-{uuid.uuid4().hex[:8]}", f"held-{uuid.uuid4().hex[:8]}"
    core.create_namespaced_pod(
        TEAM,
        {
            "metadata": {"name": pod, "labels": {LABEL_COORDINATOR_LEADER: "true"}},
            "spec": {"containers": [{"name": "coordinator", "image": "baton"}]},
        },
    )
    api_client = load_api_client(str(control_plane.admin_kubeconfig))
    leases: Any = client.CoordinationV1Api(api_client)
    # The other replica leads now, for a while: this one stands by.
    held = LeaseRecord("the-other-replica", 60, time.time(), time.time(), transitions=1)
    leases.create_namespaced_lease(LEASE_NS, lease_object(held, {"metadata": {"name": lease}}))
    config = CoordinatorConfig(
        token="token",
        namespace=LEASE_NS,
        lease_name=lease,
        identity=pod,
        llmd_listen="127.0.0.1:0",
        http_listen="127.0.0.1:0",
        pod_name=pod,
        pod_namespace=TEAM,
    )

    def labels() -> dict[str, str]:
        return core.read_namespaced_pod(pod, TEAM).metadata.labels or {}

    async def body() -> None:
        coordinator = Coordinator(config, api_client)
        await coordinator.start()
        try:
            unlabelled = await asyncio.to_thread(
                wait_for,
                "the standby's pod unlabelled",
                lambda: True if LABEL_COORDINATOR_LEADER not in labels() else None,
                WAIT_S,
            )
            assert unlabelled and not coordinator.arbiter.epoch
            ready = f"http://127.0.0.1:{coordinator.http_port}/readyz"
            assert await asyncio.to_thread(http_get, ready) == (
                503,
                f"not ready: not leading: this replica stands by to take over when Lease "
                f"{LEASE_NS}/{lease} is free\n",
            )
        finally:
            await coordinator.stop()

    try:
        asyncio.run(asyncio.wait_for(body(), 60))
    finally:
        core.delete_namespaced_pod(pod, TEAM, grace_period_seconds=0)
        leases.delete_namespaced_lease(lease, LEASE_NS)
        api_client.close()


def test_the_label_ends_as_last_wished_when_an_earlier_write_is_still_being_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stepping down (unlabel) fails for a while; the replica leads again meanwhile: its pod
    stays labelled, not unlabelled by the late retry."""
    monkeypatch.setattr(podlabel, "RETRY_FIRST_S", 0.01)
    writes: list[bool] = []
    writing, go_on = threading.Event(), threading.Event()

    def patch(leading: bool) -> None:
        writes.append(leading)
        if len(writes) == 1:  # the first write (the unlabel) fails after a while
            writing.set()
            go_on.wait(WAIT_S)
            raise OSError("the API server is unreachable")

    label = LeaderLabel(patch, f"{LEASE_NS}/coordinator-a")
    label.start()
    try:
        assert writing.wait(WAIT_S)
        label.want(True)  # it leads again while the unlabel is on its way
        go_on.set()
        wait_for("the label written", lambda: True if label.applied() else None, WAIT_S)
        assert writes == [False, True]
        label.want(False)
        wait_for("the label removed", lambda: True if label.applied() is False else None, WAIT_S)
    finally:
        go_on.set()
        label.stop()
    assert writes == [False, True, False]
    assert not any(t.name == "leader-label" and t.is_alive() for t in threading.enumerate())

"""The leader's label on its own pod (which the Service selects): removed by a replica that does
not lead, also one restarted in a pod a crashed leader had labelled; the last wish wins; a new
leader removes it from the pods of older leaders that kept it (frozen, cut off), never from a
newer leader's."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from baton.contract.kube import load_api_client
from baton.contract.names import (
    ANNOTATION_COORDINATOR_LEADER_EPOCH,
    ANNOTATION_COORDINATOR_LEADER_LEASE,
    LABEL_COORDINATOR_LEADER,
)
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
    writes: list[int] = []
    writing, go_on = threading.Event(), threading.Event()

    def patch(term: podlabel.Term) -> None:
        writes.append(term.epoch)
        if len(writes) == 1:  # the first write (the unlabel) fails after a while
            writing.set()
            go_on.wait(WAIT_S)
            raise OSError("the API server is unreachable")

    label = LeaderLabel(patch, f"{LEASE_NS}/coordinator-a")
    label.start()
    try:
        assert writing.wait(WAIT_S)
        label.want(1)  # it leads again while the unlabel is on its way
        go_on.set()
        wait_for("the label written", lambda: True if label.applied() else None, WAIT_S)
        assert writes == [0, 1]
        label.want(0)
        wait_for("the label removed", lambda: True if label.applied() == 0 else None, WAIT_S)
    finally:
        go_on.set()
        label.stop()
    assert writes == [0, 1, 0]
    assert not any(t.name == "leader-label" and t.is_alive() for t in threading.enumerate())


def coordinator_pod(
    core: Any, name: str, labels: dict[str, str], epoch: int | None = None, lease: str = ""
) -> None:
    """A coordinator's pod as its Deployment makes it (it stays Pending: no kubelet here); with
    the leader's label set in `epoch` (no annotation for 0: as an older version labelled it) of
    the Lease whose UID is `lease` (none for "")."""
    annotations = {ANNOTATION_COORDINATOR_LEADER_EPOCH: str(epoch)} if epoch else {}
    if lease:
        annotations[ANNOTATION_COORDINATOR_LEADER_LEASE] = lease
    leader = {LABEL_COORDINATOR_LEADER: "true"} if epoch is not None else {}
    core.create_namespaced_pod(
        TEAM,
        {
            "metadata": {
                "name": name,
                "labels": {**labels, **leader},
                "annotations": annotations,
            },
            "spec": {"containers": [{"name": "coordinator", "image": "baton"}]},
        },
    )


def leader_of(core: Any, name: str) -> str | None:
    """The epoch pod `name` is labelled leader in ("" where it does not say), None if it is not."""
    meta = core.read_namespaced_pod(name, TEAM).metadata
    if LABEL_COORDINATOR_LEADER not in (meta.labels or {}):
        return None
    return str((meta.annotations or {}).get(ANNOTATION_COORDINATOR_LEADER_EPOCH, ""))


def leading(
    control_plane: ControlPlane,
    core: Any,
    own: str,
    lease: str,
    during: Callable[[Coordinator], Awaitable[None]],
) -> None:
    """Run a coordinator in pod `own` (it takes Lease `lease`) until its label is on its pod,
    then `during(coordinator)`; and stop it."""
    api_client = load_api_client(str(control_plane.admin_kubeconfig))
    config = CoordinatorConfig(
        token="token",
        namespace=LEASE_NS,
        lease_name=lease,
        identity=own,
        llmd_listen="127.0.0.1:0",
        http_listen="127.0.0.1:0",
        pod_name=own,
        pod_namespace=TEAM,
    )

    async def body() -> None:
        coordinator = Coordinator(config, api_client)
        await coordinator.start()
        try:
            await asyncio.to_thread(
                wait_for,
                "the leader's own label",
                lambda: True if leader_of(core, own) is not None else None,
                WAIT_S,
            )
            await during(coordinator)
        finally:
            await coordinator.stop()

    try:
        asyncio.run(asyncio.wait_for(body(), 60))
    finally:
        api_client.close()


def test_a_new_leader_removes_the_label_older_leaders_left_on_their_pods_not_a_newer_ones(
    control_plane: ControlPlane, core: Any
) -> None:
    """Older leaders, frozen or cut off from the API server, kept their label: the Service would
    send callers to them (to hang until their deadline). The new leader removes it from its own
    Deployment's pods (of any revision) labelled in an older epoch; a pod a newer leader labelled
    (this replica is the deposed one and does not know it yet) and another Deployment's pod
    keep theirs."""
    from kubernetes import client

    app = {"app.kubernetes.io/name": f"coordinator-{uuid.uuid4().hex[:8]}"}
    own, older, unsaid, newer, other_app = (
        f"{app['app.kubernetes.io/name']}-{suffix}"
        for suffix in ("own", "older", "unsaid", "newer", "other-app")
    )
    lease = f"free-{uuid.uuid4().hex[:8]}"
    coordinator_pod(core, own, {**app, "pod-template-hash": "new"})
    coordinator_pod(core, older, {**app, "pod-template-hash": "old"}, epoch=4)
    coordinator_pod(core, unsaid, {**app, "pod-template-hash": "old"}, epoch=0)
    coordinator_pod(core, newer, {**app, "pod-template-hash": "new"}, epoch=1000)
    coordinator_pod(core, other_app, {"app.kubernetes.io/name": "another"}, epoch=4)
    api_client = load_api_client(str(control_plane.admin_kubeconfig))
    leases: Any = client.CoordinationV1Api(api_client)
    # The leader of epoch 4 released the Lease (it stopped) but its pod kept the label.
    released = LeaseRecord("", 15, time.time(), time.time(), transitions=4)
    leases.create_namespaced_lease(LEASE_NS, lease_object(released, {"metadata": {"name": lease}}))

    async def during(coordinator: Coordinator) -> None:
        await asyncio.to_thread(
            wait_for,
            "the older leaders' labels removed",
            lambda: True if leader_of(core, older) is leader_of(core, unsaid) is None else None,
            WAIT_S,
        )
        assert coordinator.arbiter.epoch == 5 and leader_of(core, own) == "5"
        assert leader_of(core, newer) == "1000"
        assert leader_of(core, other_app) == "4"

    try:
        leading(control_plane, core, own, lease, during)
        assert leader_of(core, own) is None
    finally:
        for pod in (own, older, unsaid, newer, other_app):
            core.delete_namespaced_pod(pod, TEAM, grace_period_seconds=0)
        leases.delete_namespaced_lease(lease, LEASE_NS)
        api_client.close()


def test_a_label_a_newer_leader_sets_between_the_list_and_the_removal_is_kept(
    control_plane: ControlPlane, core: Any
) -> None:
    """This replica leads in epoch 5 and lists the pods: the other's label is from epoch 3. Before
    it removes that label, the other replica takes the Lease (epoch 6) and labels its pod again:
    the removal, tested against the pod as listed, is refused, and the label stays."""
    app = {"app.kubernetes.io/name": f"coordinator-{uuid.uuid4().hex[:8]}"}
    own, other = (f"{app['app.kubernetes.io/name']}-{suffix}" for suffix in ("own", "other"))
    coordinator_pod(core, own, app, epoch=5)
    coordinator_pod(core, other, app, epoch=3)
    relabelled = threading.Event()

    class RelabelledAfterTheList:
        """The API, where the other replica labels its pod anew as soon as the first list ends."""

        def __getattr__(self, name: str) -> Any:
            return getattr(core, name)

        def list_namespaced_pod(self, *args: Any, **kwargs: Any) -> Any:
            listed = core.list_namespaced_pod(*args, **kwargs)
            if not relabelled.is_set():
                relabelled.set()
                label = {LABEL_COORDINATOR_LEADER: "true"}
                note = {ANNOTATION_COORDINATOR_LEADER_EPOCH: "6"}
                core.patch_namespaced_pod(
                    other, TEAM, {"metadata": {"labels": label, "annotations": note}}
                )
            return listed

    try:
        relabelling = RelabelledAfterTheList()
        assert podlabel.sweep(relabelling, TEAM, own, podlabel.Term(5), lambda term: True) == []
        assert relabelled.is_set()
        assert leader_of(core, other) == "6"
        # And a label left from an older epoch goes.
        assert podlabel.sweep(core, TEAM, own, podlabel.Term(7), lambda term: True) == [other]
        assert leader_of(core, other) is None
    finally:
        for pod in (own, other):
            core.delete_namespaced_pod(pod, TEAM, grace_period_seconds=0)


def test_a_label_an_older_leader_sets_after_the_sweep_is_removed_while_this_one_leads(
    control_plane: ControlPlane, core: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader of epoch 5 labelled its pod and swept; then the label write of the deposed
    leader of epoch 3 (frozen with it in flight, or cut off) lands: the Service would send
    callers to both. The leader sweeps again while it leads, and the old label goes."""
    monkeypatch.setattr(podlabel, "RESWEEP_S", 0.2)
    app = {"app.kubernetes.io/name": f"coordinator-{uuid.uuid4().hex[:8]}"}
    own, old = (f"{app['app.kubernetes.io/name']}-{suffix}" for suffix in ("own", "old"))
    coordinator_pod(core, own, app)
    coordinator_pod(core, old, app)
    api_client = load_api_client(str(control_plane.admin_kubeconfig))
    label = LeaderLabel.on_pod(api_client, TEAM, own, lambda term: True)
    label.start()
    try:
        label.want(5)
        wait_for("the leader's own label", lambda: True if leader_of(core, own) else None, WAIT_S)
        note = {ANNOTATION_COORDINATOR_LEADER_EPOCH: "3"}
        late = {"metadata": {"labels": {LABEL_COORDINATOR_LEADER: "true"}, "annotations": note}}
        core.patch_namespaced_pod(old, TEAM, late)  # the old leader's write, landing late
        wait_for(
            "the old leader's late label removed",
            lambda: True if leader_of(core, old) is None else None,
            WAIT_S,
        )
        assert leader_of(core, own) == "5"
    finally:
        label.stop()
        for pod in (own, old):
            core.delete_namespaced_pod(pod, TEAM, grace_period_seconds=0)
        api_client.close()

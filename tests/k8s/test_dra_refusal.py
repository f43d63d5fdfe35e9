"""The DRA driver on this node's containerd 1.6, which ignores CDI devices: run as a host
process, it registers with the real kubelet and publishes its slice, the real scheduler
allocates a claim from it, and the driver refuses to prepare; the pod's events say why and its
container never starts. Nothing of it stays: the device plugin serves `baton.dev/gpu` after."""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from baton.contract import names
from commands.localnode.binaries import CHECKOUT
from commands.localnode.controlplane import free_ports
from commands.localnode.kubelet import ROOT_DIR
from commands.localnode.procs import Process
from dra.server import endpoint_path, registration_path
from dra.slices import slice_name
from tests.k8s.cluster import Cluster, wait_for, wait_seen
from tests.k8s.dra.claims import claim_pod, claim_template
from tests.k8s.pods import sleeper_pod

DEVICE_CLASS = CHECKOUT / "manifests" / "overlays" / "dra" / "driver" / "deviceclass.yaml"
REFUSAL = "containerd 1.6 cannot apply CDI devices"
"""The driver's sentence (dra.runtime.cdi_refusal) for this node's runtime."""
REASON = "FailedPrepareDynamicResources"
"""The kubelet's event when a driver's NodePrepareResources answers an error."""
NODE_ANNOTATIONS = (names.ANNOTATION_GPUS, names.ANNOTATION_HOST_MEMORY_BUDGET)
PLUGINS, REGISTRY = ROOT_DIR / "plugins", ROOT_DIR / "plugins_registry"
"""The node's kubelet's plugin directories (commands.localnode.kubelet: the default root)."""
WAIT_S = 60.0


@dataclass
class HostDriver:
    """`baton dra` running on the host beside the kubelet, and where it writes."""

    process: Process
    cdi_dir: Path
    state_dir: Path
    url: str


def device_class() -> dict[str, Any]:
    """The overlay's DeviceClass without `extendedResourceName`: with it, the scheduler would
    serve this node's `baton.dev/gpu` pods by DRA instead of by the device plugin."""
    body = dict(yaml.safe_load(DEVICE_CLASS.read_text()))
    body["spec"].pop("extendedResourceName")
    return body


def readiness(url: str) -> str:
    """What the driver's /readyz answers ('ok' once registered and published)."""
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=5) as reply:
            return str(reply.read().decode()).strip()
    except urllib.error.HTTPError as err:
        return str(err.read().decode()).strip()
    except OSError as err:
        return f"no answer: {err}"


def node_annotations(cluster: Cluster) -> dict[str, str]:
    notes = cluster.get("node", cluster.node_name)["metadata"].get("annotations") or {}
    return {k: notes.get(k, "") for k in NODE_ANNOTATIONS}


def gone(cluster: Cluster, *what: str) -> bool | None:
    return True if cluster.try_kubectl("get", *what, "-o", "name") == "" else None


def refusals(cluster: Cluster, namespace: str, pod: str) -> int:
    """How often the kubelet reported failing to prepare the pod's claims (event count)."""
    events = cluster.get(
        "events", "-n", namespace, f"--field-selector=involvedObject.name={pod},reason={REASON}"
    )
    return sum(int(e.get("count") or 1) for e in events["items"])


def driver_argv(cluster: Cluster, work: Path, port: int) -> list[str]:
    """`baton dra` for this node: the kubelet's plugin directories, its own CDI and state
    directories in `work`, the device plugin's two simulated GPUs and host budget."""
    return [
        sys.executable, "-m", "baton", "dra",
        f"--node-name={cluster.node_name}",
        f"--kubeconfig={cluster.node.kubeconfig}",
        f"--plugins-dir={PLUGINS}",
        f"--registry-dir={REGISTRY}",
        f"--cdi-dir={work / 'cdi'}",
        f"--state-dir={work / 'state'}",
        "--fake-gpus=2x81920",
        "--host-memory-budget=131072",
        "--metrics-host=127.0.0.1",
        f"--metrics-port={port}",
    ]  # fmt: skip


@pytest.fixture
def host_driver(cluster: Cluster, tmp_path: Path) -> Iterator[HostDriver]:
    """The driver registered with the real kubelet and its slice published; stopped after (its
    sockets gone), its slice deleted, the node's annotations as they were."""
    before = node_annotations(cluster)
    port = free_ports(1)[0]
    process = Process("baton-dra", driver_argv(cluster, tmp_path, port), tmp_path / "dra.log")
    driver = HostDriver(process, tmp_path / "cdi", tmp_path / "state", f"http://127.0.0.1:{port}")
    sockets = (endpoint_path(PLUGINS), registration_path(REGISTRY))
    ours = ("resourceslice", slice_name(cluster.node_name), "--ignore-not-found")
    process.start()
    try:

        def ready() -> str:
            process.check()
            return readiness(driver.url)

        wait_seen("the driver registered with the kubelet", ready, lambda s: s == "ok", WAIT_S)
        yield driver
    finally:
        process.stop()
        cluster.kubectl("delete", *ours)
        wait_for("the driver's slice deleted", lambda: gone(cluster, *ours), WAIT_S)
        if sockets[0].parent.is_dir() and not any(sockets[0].parent.iterdir()):
            sockets[0].parent.rmdir()
        left = [str(s) for s in sockets if s.exists()]
        assert not left, f"the stopped driver left its sockets: {left}\n{process.tail()}"
        assert node_annotations(cluster) == before


@pytest.fixture
def driver_class(cluster: Cluster, host_driver: HostDriver) -> Iterator[None]:
    """The driver's DeviceClass (`device_class()`), deleted after."""
    cluster.apply(device_class())
    try:
        yield
    finally:
        cluster.kubectl("delete", "deviceclass", names.DRA_DEVICE_CLASS, "--ignore-not-found")


def test_the_driver_refuses_claims_where_containerd_cannot_apply_cdi(
    cluster: Cluster, namespace: str, host_driver: HostDriver, driver_class: None
) -> None:
    ns = namespace
    node = cluster.get("node", cluster.node_name)
    runtime = node["status"]["nodeInfo"]["containerRuntimeVersion"]
    assert runtime.startswith("containerd://1.6."), runtime
    pod = claim_pod("refused", ns, "refused-10g")
    del pod["spec"]["schedulerName"]  # the cluster's kube-scheduler allocates the claim
    try:
        cluster.apply(claim_template("refused-10g", ns, 10, 10), pod)
        text = wait_seen(
            f"pod refused's events to carry the driver's refusal ({REFUSAL})",
            lambda: " ".join(cluster.describe(ns, "refused").split()),
            lambda seen: REFUSAL in seen,
            WAIT_S,
        )
        assert f"Warning {REASON} " in text and f"node {cluster.node_name} cannot" in text, text
        wait_seen(
            f"the kubelet to try again ({REASON} twice)",
            lambda: refusals(cluster, ns, "refused"),
            lambda seen: seen >= 2,
            WAIT_S,
        )
        print(f"\n--- kubectl describe pod refused ---\n{cluster.describe(ns, 'refused')}")
        refused = cluster.pod(ns, "refused")
        claim_name = refused["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        claim = cluster.get("resourceclaim", "-n", ns, claim_name)
        results = claim["status"]["allocation"]["devices"]["results"]
        assert [(r["driver"], r["pool"]) for r in results] == [
            (names.DRA_DRIVER, cluster.node_name)
        ], results
        assert refused["status"]["phase"] == "Pending", refused["status"]
        for status in refused["status"].get("containerStatuses") or []:
            assert not status.get("started") and "waiting" in status.get("state", {}), status
        assert not list(host_driver.cdi_dir.glob("*")), "a CDI spec was written"
        record = host_driver.state_dir / "prepared-claims.json"
        assert claim["metadata"]["uid"] not in (record.read_text() if record.exists() else "")
    finally:
        cluster.kubectl("delete", "pod", "-n", ns, "refused", "--ignore-not-found", timeout=90)
        cluster.kubectl(
            "delete", "resourceclaimtemplate", "-n", ns, "refused-10g", "--ignore-not-found"
        )
        wait_for(
            "the pod's claim deleted",
            lambda: gone(cluster, "resourceclaims", "-n", ns),
            WAIT_S,
        )


def test_the_device_plugin_serves_gpus_after_the_driver_left(
    cluster: Cluster, namespace: str
) -> None:
    """No class, slice or registration of the driver is left to take `baton.dev/gpu` pods."""
    assert gone(cluster, "deviceclasses") and gone(cluster, "resourceslices")
    cluster.apply(sleeper_pod("after-dra", namespace))
    pod = cluster.wait_phase(namespace, "after-dra", {"Running"}, 120)
    assert (pod["metadata"]["uid"], "trainer") in cluster.kubelet_allocations()
    assert not pod["status"].get("resourceClaimStatuses") and not pod["status"].get(
        "extendedResourceClaimStatus"
    )
    cluster.kubectl("delete", "pod", "-n", namespace, "after-dra", "--grace-period=0", "--force")

"""Installing Baton on the local node with the project's own manifests."""

from __future__ import annotations

from pathlib import Path

from baton.contract import names
from commands.localnode.binaries import CHECKOUT
from commands.localnode.node import LocalNode
from commands.localnode.procs import wait_for

HOST_DIRS = (Path("/run/baton"), Path("/var/lib/baton"), Path("/run/baton-fake-gpus"))
"""What the overlay's hostPath volumes create on the node: gone with the node if it made them."""
OVERLAY = CHECKOUT / "manifests" / "overlays" / "local"
WORKLOADS = (
    "daemonset/baton-deviceplugin",
    "daemonset/baton-agent",
    "deployment/baton-extender",
    "deployment/baton-scheduler",
)


def install_baton(node: LocalNode, timeout_s: int = 90) -> None:
    """`kubectl apply -k manifests/overlays/local`, wait for every daemon to roll out and for
    the node to show the device plugin's slots.

    The kubelet reports a registered plugin's devices in the node's status on its next status
    update (up to 10 s later): until then kube-scheduler refuses every tenant pod with
    "Insufficient baton.dev/gpu".
    """
    node.kubectl("apply", "-k", str(OVERLAY), timeout=60)
    for workload in WORKLOADS:
        node.kubectl(
            "-n", names.NAMESPACE, "rollout", "status", workload, f"--timeout={timeout_s}s",
            timeout=timeout_s + 10,
        )  # fmt: skip

    def slots() -> bool | None:
        node_obj = node.plane.get(f"/api/v1/nodes/{node.node_name}")
        assert isinstance(node_obj, dict)
        allocatable = node_obj.get("status", {}).get("allocatable", {})
        return True if int(allocatable.get(names.RESOURCE_GPU, "0")) > 0 else None

    wait_for(f"node {node.node_name} to show {names.RESOURCE_GPU} slots", slots, timeout_s, 0.2)


OVERLAY_DRA = CHECKOUT / "manifests" / "overlays" / "local-dra"
WORKLOADS_DRA = tuple(w.replace("deviceplugin", "dra") for w in WORKLOADS)


def install_baton_dra(node: LocalNode, timeout_s: int = 90) -> None:
    """`kubectl apply -k manifests/overlays/local-dra` (the node must run containerd 2.x), wait
    for every daemon to roll out and for the driver's ResourceSlice of this node."""
    node.kubectl("apply", "-k", str(OVERLAY_DRA), timeout=60)
    for workload in WORKLOADS_DRA:
        node.kubectl(
            "-n", names.NAMESPACE, "rollout", "status", workload, f"--timeout={timeout_s}s",
            timeout=timeout_s + 10,
        )  # fmt: skip

    def published() -> bool | None:
        found = node.plane.get(
            "/apis/resource.k8s.io/v1/resourceslices?fieldSelector="
            f"spec.nodeName={node.node_name},spec.driver={names.DRA_DRIVER}"
        )
        assert isinstance(found, dict)
        return True if any(s["spec"].get("devices") for s in found.get("items") or []) else None

    wait_for(f"node {node.node_name}'s ResourceSlice of {names.DRA_DRIVER}", published, timeout_s)

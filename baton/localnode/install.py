"""Installing Baton on the local node with the project's own manifests."""

from __future__ import annotations

from pathlib import Path

from baton import names
from baton.localnode.binaries import CHECKOUT
from baton.localnode.node import LocalNode

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
    """`kubectl apply -k manifests/overlays/local` and wait for every daemon to roll out."""
    node.kubectl("apply", "-k", str(OVERLAY), timeout=60)
    for workload in WORKLOADS:
        node.kubectl(
            "-n", names.NAMESPACE, "rollout", "status", workload, f"--timeout={timeout_s}s",
            timeout=timeout_s + 10,
        )  # fmt: skip

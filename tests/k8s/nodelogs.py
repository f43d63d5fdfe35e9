"""What a failed real-node test reports besides its own message: the node's logs.

The node's processes (kubelet, containerd, the control plane) log to files under the node's
root, and Baton's daemons run as pods; a CI run keeps neither, so a failure carries their tails
in its report (pytest prints them under "the node's logs").
"""

from __future__ import annotations

from pathlib import Path

from baton.contract import names
from tests.k8s.cluster import Cluster

TAIL_LINES = 60
KUBELET_TOPICS = ("device", "plugin", "registration", "dra", names.RESOURCE_GPU, "allocatable")
"""Kubelet lines about the devices it serves, kept apart: they are what the faults touch."""


def tail(lines: list[str], n: int = TAIL_LINES) -> str:
    return "\n".join(lines[-n:])


def node_logs(cluster: Cluster) -> str:
    """The tails of every node process's log and every Baton daemon's pod log."""
    parts: list[str] = []
    for log in sorted(Path(cluster.node.root, "logs").glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()
        parts.append(f"--- {log.name}, last {TAIL_LINES} of {len(lines)} lines ---\n{tail(lines)}")
        if log.name == "kubelet.log":
            about = [line for line in lines if any(t in line.lower() for t in KUBELET_TOPICS)]
            parts.append(f"--- kubelet.log, its last lines about devices ---\n{tail(about)}")
    found = cluster.try_kubectl("get", "pods", "-n", names.NAMESPACE, "-o", "name") or ""
    for pod in found.split():
        said = cluster.try_kubectl(
            "logs", "-n", names.NAMESPACE, pod, "--all-containers", f"--tail={TAIL_LINES}"
        )
        parts.append(f"--- {pod} (kubectl logs) ---\n{said or '(its log could not be read)'}")
    return "\n".join(parts)

"""A real single Kubernetes node on loopback, from release binaries, for tests and benches.

`ControlPlane` runs etcd, kube-apiserver, kube-controller-manager and kube-scheduler;
`LocalNode` adds containerd, a bridge CNI network and a kubelet. Both stop everything they
started (processes, containers, mounts, interfaces) when closed, also on SIGINT/SIGTERM.
"""

from commands.localnode.binaries import KubeBinaries, find_binaries
from commands.localnode.controlplane import ControlPlane
from commands.localnode.node import LocalNode

__all__ = ["ControlPlane", "KubeBinaries", "LocalNode", "find_binaries"]

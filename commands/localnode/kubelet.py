"""The kubelet's configuration and process, and the directories it leaves behind."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

from baton.contract import names
from commands.localnode.pki import Pki, kubeconfig
from commands.localnode.procs import Process
from commands.localnode.runtime import unmount_under

ROOT_DIR = Path("/var/lib/kubelet")
"""The default root: device plugins and PodResources live under it on every real node too."""
POD_RESOURCES = ROOT_DIR / "pod-resources"
DEVICE_CHECKPOINT = ROOT_DIR / "device-plugins" / "kubelet_internal_checkpoint"
CGROUP_ROOT = Path("/sys/fs/cgroup")


def kubelet_config(pki: Pki, run_dir: Path, containerd_socket: Path) -> Path:
    """A KubeletConfiguration for this machine (cgroupfs on cgroup v1, no swap check)."""
    path = run_dir / "kubelet.yaml"
    path.write_text(
        f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://{containerd_socket}
enforceNodeAllocatable: []
evictionHard: {{}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
podLogsDir: {run_dir / "pod-logs"}
volumePluginDir: {run_dir / "volume-plugins"}
tlsCertFile: {pki.cert("kubelet-serving")}
tlsPrivateKeyFile: {pki.key("kubelet-serving")}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {pki.ca_cert}}}
authorization: {{mode: AlwaysAllow}}
resolvConf: /etc/resolv.conf
shutdownGracePeriod: 0s
nodeStatusUpdateFrequency: 4s
syncFrequency: 10s
fileCheckFrequency: 5s
"""
    )
    return path


def kubelet_process(
    binary: Path, pki: Pki, run_dir: Path, server: str, node_name: str, socket: Path
) -> Process:
    """The kubelet process (not started), labelled as a Baton GPU node."""
    config = kubelet_config(pki, run_dir, socket)
    kubecfg = kubeconfig(pki, "kubelet", server, run_dir / "kubelet.kubeconfig")
    argv = [
        str(binary),
        f"--config={config}",
        f"--kubeconfig={kubecfg}",
        f"--hostname-override={node_name}",
        f"--root-dir={ROOT_DIR}",
        f"--cert-dir={run_dir / 'kubelet-certs'}",
        f"--node-labels={names.LABEL_GPU_NODE}=true",
        "--v=2",  # the device manager's and the DRA manager's registrations and connections
    ]
    return Process("kubelet", argv, run_dir / "logs" / "kubelet.log")


def forget_earlier_nodes() -> None:
    """Remove the device manager's record of an earlier node's pods (the kubelet keeps it across
    its restarts, and it outlives a node): a kubelet that reads another cluster's allocations of
    `baton.dev/gpu` takes the resource for a device plugin's, and on the DRA path fails each
    container asking it ("endpoint not found in cache for a registered resource")."""
    with contextlib.suppress(FileNotFoundError):
        DEVICE_CHECKPOINT.unlink()


def clean_kubelet_dirs(created_root: bool) -> None:
    """Unmount what the kubelet mounted; remove its root if this node created it."""
    unmount_under(ROOT_DIR)
    if created_root:
        shutil.rmtree(ROOT_DIR, ignore_errors=True)
    else:
        for sub in ("pods", "plugins", "plugins_registry", "pod-resources"):
            shutil.rmtree(ROOT_DIR / sub, ignore_errors=True)


def remove_pod_cgroups() -> None:
    """Remove the (empty, once every container is gone) kubepods cgroups the kubelet made."""
    for top in CGROUP_ROOT.glob("*/kubepods*"):
        for directory in sorted(
            (p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
        ):
            with contextlib.suppress(OSError):
                directory.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()

"""Finding a tenant's GPU processes and memory limit: NVML process lists and cgroup files."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def cgroup_path(pid: int, proc_root: str = "/proc") -> str:
    """The process's cgroup v2 path ("/kubepods.slice/..."), or "" if it cannot be read."""
    try:
        text = Path(proc_root, str(pid), "cgroup").read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:]
    return ""


def in_pod(pid: int, pod_uid: str, proc_root: str = "/proc") -> bool:
    """Whether the process runs in the pod (cgroupfs spells the UID with dashes, systemd with _)."""
    path = cgroup_path(pid, proc_root)
    return bool(pod_uid) and (pod_uid in path or pod_uid.replace("-", "_") in path)


def memory_limit(
    pid: int, proc_root: str = "/proc", cgroup_root: str = "/sys/fs/cgroup"
) -> int | None:
    """The tightest `memory.max` on the process's cgroup path, in bytes; None if unlimited."""
    path = cgroup_path(pid, proc_root)
    if not path:
        return None
    limits = []
    node = Path(cgroup_root, path.lstrip("/"))
    root = Path(cgroup_root)
    while True:
        try:
            value = (node / "memory.max").read_text().strip()
        except OSError:
            value = "max"
        if value != "max":
            limits.append(int(value))
        if node == root or root not in node.parents:
            break
        node = node.parent
    return min(limits) if limits else None


def gpu_processes(nvml: Any, gpu_uuid: str) -> dict[int, int]:
    """Host PID to bytes used, for the compute processes NVML sees on the GPU."""
    handle = nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
    return {
        int(p.pid): int(p.usedGpuMemory or 0)
        for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    }


def gpu_memory(nvml: Any) -> dict[str, int]:
    """Every GPU's UUID and total memory in bytes."""
    out = {}
    for i in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        uuid = nvml.nvmlDeviceGetUUID(handle)
        uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        out[uuid] = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
    return out

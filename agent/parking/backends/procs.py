"""Finding a tenant's processes and memory cgroup: /proc, cgroup files and NVML process lists.

A pod's processes are every process whose cgroup path (any hierarchy, cgroup v1 or v2) names
the pod: `.../kubepods/besteffort/pod<UID>/<container>` with the cgroupfs driver,
`.../kubepods-besteffort-pod<UID with _>.slice/...` with the systemd driver.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.node.identity import user_delegated

V1_UNLIMITED = 1 << 62
"""cgroup v1 spells "no limit" as a page-rounded 2**63-1; anything this large is unlimited."""


@dataclass(frozen=True)
class CgroupMemory:
    """The memory cgroup with the least room on a process's path: its limit and its usage."""

    limit: int
    used: int


def cgroup_lines(pid: int, proc_root: str = "/proc") -> list[tuple[str, str]]:
    """(controllers, path) for each line of `/proc/<pid>/cgroup`; empty if it cannot be read."""
    try:
        text = Path(proc_root, str(pid), "cgroup").read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            out.append((parts[1], parts[2]))
    return out


def cgroup_path(pid: int, proc_root: str = "/proc") -> str:
    """The process's cgroup v2 path ("/kubepods.slice/..."), or "" if it has none."""
    for controllers, path in cgroup_lines(pid, proc_root):
        if controllers == "":
            return path
    return ""


def names_pod(path: str, pod_uid: str) -> bool:
    """Whether a cgroup path is in the pod's cgroup (either spelling of the UID); one under
    `user.slice`, which a local user may name like a pod's, is no pod's (`user_delegated`)."""
    if not pod_uid or "kubepods" not in path or user_delegated(path):
        return False
    return f"pod{pod_uid}" in path or f"pod{pod_uid.replace('-', '_')}" in path


def in_pod(pid: int, pod_uid: str, proc_root: str = "/proc") -> bool:
    """Whether the process runs in the pod."""
    return any(names_pod(path, pod_uid) for _, path in cgroup_lines(pid, proc_root))


def process_of(pid: int, proc_root: str = "/proc") -> int:
    """The process a PID belongs to: itself, or for a thread's ID its thread group (`Tgid` in
    `/proc/<id>/status`; the driver takes a thread's ID for its process); itself if unknown."""
    try:
        text = Path(proc_root, str(pid), "status").read_text()
    except OSError:
        return pid
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "Tgid" and value.strip().isdigit():
            return int(value.strip())
    return pid


def pod_pids(pod_uid: str, proc_root: str = "/proc") -> tuple[int, ...]:
    """Every process of every container of the pod, found by scanning `/proc/*/cgroup`."""
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return ()
    return tuple(
        sorted(int(e) for e in entries if e.isdigit() and in_pod(int(e), pod_uid, proc_root))
    )


def maps_path(pid: int, needle: str, proc_root: str = "/proc") -> bool:
    """Whether the process maps a file whose path contains `needle` (e.g. NCCL's shm segments)."""
    try:
        with Path(proc_root, str(pid), "maps").open() as f:
            return any(needle in line for line in f)
    except OSError:
        return False


def _read_int(path: Path) -> int | None:
    try:
        value = path.read_text().strip()
    except OSError:
        return None
    if value == "max" or not value.isdigit():
        return None
    return int(value)


def memory_cgroup(
    pid: int, proc_root: str = "/proc", cgroup_root: str = "/sys/fs/cgroup"
) -> CgroupMemory | None:
    """The limited memory cgroup on the process's path with the least room; None if unlimited.

    cgroup v2: `memory.max` and `memory.current` under `cgroup_root`; cgroup v1: the memory
    controller's `memory.limit_in_bytes` and `memory.usage_in_bytes` under `cgroup_root/memory`.
    """
    lines = cgroup_lines(pid, proc_root)
    v1 = [p for c, p in lines if "memory" in c.split(",")]
    if v1:
        base, rel, limit_file, used_file = (
            Path(cgroup_root, "memory"), v1[0], "memory.limit_in_bytes", "memory.usage_in_bytes"
        )  # fmt: skip
    else:
        v2 = [p for c, p in lines if c == ""]
        if not v2:
            return None
        base, rel, limit_file, used_file = (
            Path(cgroup_root), v2[0], "memory.max", "memory.current"
        )  # fmt: skip
    best: CgroupMemory | None = None
    node = base / rel.lstrip("/")
    while True:
        limit = _read_int(node / limit_file)
        if limit is not None and limit < V1_UNLIMITED:
            here = CgroupMemory(limit, _read_int(node / used_file) or 0)
            if best is None or here.limit - here.used < best.limit - best.used:
                best = here
        if node == base or base not in node.parents:
            break
        node = node.parent
    return best


def memory_limit(
    pid: int, proc_root: str = "/proc", cgroup_root: str = "/sys/fs/cgroup"
) -> int | None:
    """The limit of the memory cgroup with the least room on the process's path, in bytes."""
    found = memory_cgroup(pid, proc_root, cgroup_root)
    return None if found is None else found.limit


def gpu_processes(nvml: Any, gpu_uuid: str) -> dict[int, int]:
    """Host PID to bytes used, for the compute processes NVML sees on the GPU."""
    handle = nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
    return {
        int(p.pid): int(p.usedGpuMemory or 0)
        for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    }


def gpu_free(nvml: Any, gpu_uuid: str) -> int:
    """Free device memory on the GPU in bytes, as NVML reports it."""
    return int(nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)).free)


def gpu_memory(nvml: Any) -> dict[str, int]:
    """Every GPU's UUID and total memory in bytes."""
    out = {}
    for i in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        uuid = nvml.nvmlDeviceGetUUID(handle)
        uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        out[uuid] = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
    return out

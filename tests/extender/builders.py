"""Pods and nodes shaped like the API server's JSON, for the extender's tests."""

from __future__ import annotations

import json
import uuid as uuidlib
from typing import Any

from baton.contract.annotations import GpuRecord, gpu_fields
from baton.contract.names import (
    ANNOTATION_ASSIGNED_GPUS,
    ANNOTATION_GPUS,
    ANNOTATION_HOST_MEMORY_BUDGET,
    RESOURCE_GPU,
    RESOURCE_GPU_DUTY,
    RESOURCE_GPU_MEMORY,
    SCHEDULER_NAME,
)

H100_MIB = 81920
H100_MODEL = "NVIDIA H100 80GB HBM3"


def gpu_entry(
    uuid: str, index: int = 0, memory: int = H100_MIB, slots: int = 4, healthy: bool = True
) -> dict[str, Any]:
    return gpu_fields(GpuRecord(uuid, index, H100_MODEL, memory, slots, healthy))


def node(
    name: str,
    gpus: int | list[dict[str, Any]] = 8,
    budget_mib: int | None = 256 * 1024,
    memory: int = H100_MIB,
    slots: int = 4,
) -> dict[str, Any]:
    """A Node with the device plugin's annotations (GPU UUIDs `GPU-<name>-<i>`)."""
    entries = (
        gpus
        if isinstance(gpus, list)
        else [gpu_entry(f"GPU-{name}-{i}", i, memory, slots) for i in range(gpus)]
    )
    notes = {ANNOTATION_GPUS: json.dumps(entries)}
    if budget_mib is not None:
        notes[ANNOTATION_HOST_MEMORY_BUDGET] = str(budget_mib)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": notes,
            "labels": {"kubernetes.io/hostname": name},
        },
        "status": {
            "allocatable": {RESOURCE_GPU: str(len(entries) * slots), "cpu": "64", "memory": "1Ti"},
        },
    }


def pod(
    name: str = "trainer",
    gpus: int | str | None = 1,
    memory: int | str | None = None,
    duty: int | str | None = None,
    memory_limit: str | None = "512Gi",
    namespace: str = "default",
    node_name: str | None = None,
    assigned: list[str] | None = None,
    uid: str | None = None,
) -> dict[str, Any]:
    """A Pod asking for Baton resources the way a user writes them (limits, strings)."""
    limits: dict[str, str] = {"cpu": "8"}
    if memory_limit is not None:
        limits["memory"] = memory_limit
    for key, value in (
        (RESOURCE_GPU, gpus),
        (RESOURCE_GPU_MEMORY, memory),
        (RESOURCE_GPU_DUTY, duty),
    ):
        if value is not None:
            limits[key] = str(value)
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid or str(uuidlib.uuid4()),
        "resourceVersion": "1",
        "annotations": {},
    }
    if assigned is not None:
        meta["annotations"][ANNOTATION_ASSIGNED_GPUS] = ",".join(assigned)
    spec: dict[str, Any] = {
        "schedulerName": SCHEDULER_NAME,
        "containers": [{"name": "main", "image": "trainer:1", "resources": {"limits": limits}}],
    }
    if node_name:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": spec,
        "status": {"phase": "Running" if node_name else "Pending"},
    }

"""Reading GPU inventories from node annotations and assignments from pods (plain dicts)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from baton.contract.names import (
    ANNOTATION_ASSIGNED_GPUS,
    ANNOTATION_GPUS,
    ANNOTATION_HOST_MEMORY_BUDGET,
)
from baton.contract.podask import RequestError, TenantRequest, parse_pod_request
from extender.snapshot import Gpu, Tenant

_DONE_PHASES = frozenset({"Succeeded", "Failed"})


class InventoryError(ValueError):
    """A node's Baton annotations are present but unreadable."""


@dataclass(frozen=True, slots=True)
class NodeInventory:
    """What the device plugin published on a node."""

    gpus: tuple[Gpu, ...]
    budget_mib: int
    problem: str = ""


@dataclass(frozen=True, slots=True)
class Assignment:
    """A pod holding slots on GPUs of a node."""

    uid: str
    pod: str
    """namespace/name"""
    node: str
    gpus: tuple[str, ...]
    tenant: Tenant


def annotations_of(obj: dict[str, Any]) -> dict[str, str]:
    """An object's annotations (empty when it has none)."""
    return (obj.get("metadata") or {}).get("annotations") or {}


def node_inventory(node: dict[str, Any]) -> NodeInventory:
    """A node's GPUs and budget; an unreadable annotation becomes `problem`, not an exception."""
    notes = annotations_of(node)
    try:
        gpus = parse_gpus(notes.get(ANNOTATION_GPUS))
        budget = parse_budget(notes.get(ANNOTATION_HOST_MEMORY_BUDGET))
    except InventoryError as err:
        return NodeInventory((), 0, str(err))
    return NodeInventory(gpus, budget)


def parse_gpus(text: str | None) -> tuple[Gpu, ...]:
    """The `baton.dev/gpus` annotation as GPUs (none when absent)."""
    if text is None:
        return ()
    try:
        items = json.loads(text)
        if not isinstance(items, list):
            raise TypeError("not a list")
        return tuple(_gpu(item) for item in items)
    except (ValueError, TypeError, KeyError) as err:
        raise InventoryError(f"node annotation {ANNOTATION_GPUS} is unreadable: {err}") from None


def gpu_entry(gpu: Gpu) -> dict[str, Any]:
    """One GPU as the `baton.dev/gpus` annotation lists it (what `parse_gpus` reads back)."""
    return {
        "uuid": gpu.uuid,
        "index": gpu.index,
        "model": gpu.model,
        "memoryMiB": gpu.memory_mib,
        "slots": gpu.slots,
        "healthy": gpu.healthy,
    }


def _gpu(item: dict[str, Any]) -> Gpu:
    gpu = Gpu(
        uuid=str(item["uuid"]),
        index=int(item["index"]),
        model=str(item.get("model", "")),
        memory_mib=int(item["memoryMiB"]),
        slots=int(item["slots"]),
        healthy=bool(item.get("healthy", True)),
    )
    if gpu.memory_mib < 0 or gpu.slots < 1:
        raise ValueError(f"GPU {gpu.uuid} has memoryMiB {gpu.memory_mib}, slots {gpu.slots}")
    return gpu


def parse_budget(text: str | None) -> int:
    """The `baton.dev/host-memory-budget` annotation in MiB (0 when absent: nothing may park)."""
    if text is None:
        return 0
    try:
        budget = int(text)
    except ValueError:
        raise InventoryError(
            f"node annotation {ANNOTATION_HOST_MEMORY_BUDGET} {text!r} is not a number of MiB"
        ) from None
    if budget < 0:
        raise InventoryError(
            f"node annotation {ANNOTATION_HOST_MEMORY_BUDGET} {budget} is negative"
        )
    return budget


def pod_name(pod: dict[str, Any]) -> str:
    """namespace/name of a pod."""
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def pod_uid(pod: dict[str, Any]) -> str:
    """The pod's UID, or namespace/name when it has none (objects built by hand)."""
    return str((pod.get("metadata") or {}).get("uid") or pod_name(pod))


def assignment(
    pod: dict[str, Any],
    request_of: Callable[[dict[str, Any]], TenantRequest | None] = parse_pod_request,
) -> Assignment | None:
    """The GPUs a bound, live pod holds, or `None` when it holds none (its request read by
    `request_of`)."""
    node = (pod.get("spec") or {}).get("nodeName")
    assigned = annotations_of(pod).get(ANNOTATION_ASSIGNED_GPUS)
    phase = (pod.get("status") or {}).get("phase")
    if not node or not assigned or phase in _DONE_PHASES:
        return None
    uid = pod_uid(pod)
    try:
        request = request_of(pod)
    except RequestError:
        request = None
    memory, duty = (request.memory_mib, request.duty) if request else (None, None)
    gpus = tuple(g for g in (part.strip() for part in assigned.split(",")) if g)
    return Assignment(uid, pod_name(pod), node, gpus, Tenant(uid, memory, duty))

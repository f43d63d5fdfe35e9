"""Reading GPU inventories from node annotations and assignments from pods (plain dicts)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from baton.contract.annotations import (
    AnnotationError,
    GpuRecord,
    decode_assigned_gpus,
    decode_budget,
    decode_gpus,
)
from baton.contract.names import (
    ANNOTATION_ASSIGNED_GPUS,
    ANNOTATION_GPUS,
    ANNOTATION_HOST_MEMORY_BUDGET,
)
from baton.contract.podask import RequestError, TenantRequest, parse_pod_request
from extender.snapshot import PlacedPod

_DONE_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class NodeInventory:
    """What the device plugin published on a node."""

    gpus: tuple[GpuRecord, ...]
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
    tenant: PlacedPod


def annotations_of(obj: dict[str, Any]) -> dict[str, str]:
    """An object's annotations (empty when it has none)."""
    return (obj.get("metadata") or {}).get("annotations") or {}


NOT_ANNOTATED = (
    f"node has no {ANNOTATION_GPUS} annotation: Baton's device plugin or DRA driver on the node"
    " writes it (is one running there?)"
)


def node_inventory(node: dict[str, Any]) -> NodeInventory:
    """A node's GPUs and budget; an unreadable or absent GPU annotation becomes `problem`, not
    an exception."""
    notes = annotations_of(node)
    if ANNOTATION_GPUS not in notes:
        return NodeInventory((), 0, NOT_ANNOTATED)
    try:
        gpus = decode_gpus(notes.get(ANNOTATION_GPUS))
        budget = decode_budget(notes.get(ANNOTATION_HOST_MEMORY_BUDGET))
    except AnnotationError as err:
        return NodeInventory((), 0, str(err))
    return NodeInventory(gpus, budget)


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
    gpus = decode_assigned_gpus(annotations_of(pod).get(ANNOTATION_ASSIGNED_GPUS))
    phase = (pod.get("status") or {}).get("phase")
    if not node or not gpus or phase in _DONE_PHASES:
        return None
    uid = pod_uid(pod)
    try:
        request = request_of(pod)
    except RequestError:
        request = None
    memory, duty = (request.memory_mib, request.duty) if request else (None, None)
    return Assignment(uid, pod_name(pod), node, gpus, PlacedPod(uid, memory, duty))

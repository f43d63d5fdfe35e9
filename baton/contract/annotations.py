"""One codec per `baton.dev/*` annotation: what each holds is written and read here only.

The device plugin writes the node's inventory and budget and corrects the pods' GPUs from the
kubelet's allocation; the extender writes the assignment at bind; everyone reads them back here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from baton.contract.kube import format_timestamp_ns, parse_timestamp_ns
from baton.contract.names import (
    ANNOTATION_ALLOCATED_AT,
    ANNOTATION_ASSIGNED_AT,
    ANNOTATION_ASSIGNED_GPUS,
    ANNOTATION_CONTAINER_GPUS,
    ANNOTATION_GPUS,
    ANNOTATION_HOST_MEMORY_BUDGET,
    ANNOTATION_PARKING,
)

ContainerGpus = Mapping[str, tuple[str, ...]]
"""Container name → its sorted GPU UUIDs."""


class AnnotationError(ValueError):
    """A node's Baton annotation is present but unreadable; the message names it."""


@dataclass(frozen=True, slots=True)
class GpuRecord:
    """One GPU of a node's inventory, as `baton.dev/gpus` lists it."""

    uuid: str
    index: int
    model: str
    memory_mib: int
    slots: int
    healthy: bool = True


def gpu_fields(gpu: GpuRecord) -> dict[str, Any]:
    """One GPU as the `baton.dev/gpus` JSON list holds it."""
    return {
        "uuid": gpu.uuid,
        "index": gpu.index,
        "model": gpu.model,
        "memoryMiB": gpu.memory_mib,
        "slots": gpu.slots,
        "healthy": gpu.healthy,
    }


def encode_gpus(gpus: Iterable[GpuRecord]) -> str:
    """The `baton.dev/gpus` value: compact JSON, in the order given."""
    return json.dumps([gpu_fields(g) for g in gpus], separators=(",", ":"))


def decode_gpus(text: str | None) -> tuple[GpuRecord, ...]:
    """The `baton.dev/gpus` value as records (none when absent)."""
    if text is None:
        return ()
    try:
        items = json.loads(text)
        if not isinstance(items, list):
            raise TypeError("not a list")
        return tuple(_gpu(item) for item in items)
    except (ValueError, TypeError, KeyError, OverflowError) as err:  # 1e999: an infinity
        raise AnnotationError(f"node annotation {ANNOTATION_GPUS} is unreadable: {err}") from None


def _gpu(item: dict[str, Any]) -> GpuRecord:
    gpu = GpuRecord(
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


def encode_budget(mib: int) -> str:
    """The `baton.dev/host-memory-budget` value: MiB."""
    return str(mib)


def decode_budget(text: str | None) -> int:
    """The `baton.dev/host-memory-budget` value in MiB (0 when absent: nothing may park)."""
    if text is None:
        return 0
    try:
        budget = int(text)
    except ValueError:
        raise AnnotationError(
            f"node annotation {ANNOTATION_HOST_MEMORY_BUDGET} {text!r} is not a number of MiB"
        ) from None
    if budget < 0:
        raise AnnotationError(
            f"node annotation {ANNOTATION_HOST_MEMORY_BUDGET} {budget} is negative"
        )
    return budget


def node_annotations(gpus: Iterable[GpuRecord], budget_mib: int) -> dict[str, str]:
    """The node's `baton.dev/gpus` and `baton.dev/host-memory-budget`."""
    return {
        ANNOTATION_GPUS: encode_gpus(gpus),
        ANNOTATION_HOST_MEMORY_BUDGET: encode_budget(budget_mib),
    }


def encode_assigned_gpus(gpus: Iterable[str]) -> str:
    """The `baton.dev/assigned-gpus` value: comma-separated UUIDs."""
    return ",".join(gpus)


def decode_assigned_gpus(text: str | None) -> tuple[str, ...]:
    """The `baton.dev/assigned-gpus` value's UUIDs, in order (none when absent)."""
    if not text:
        return ()
    return tuple(g for g in (part.strip() for part in text.split(",")) if g)


def encode_timestamp(ns: int) -> str:
    """A `baton.dev/assigned-at` or `baton.dev/allocated-at` value: RFC 3339, nanoseconds."""
    return format_timestamp_ns(ns)


def decode_timestamp(text: object) -> int | None:
    """Nanoseconds since the epoch of a timestamp annotation; `None` when absent or unreadable."""
    if not isinstance(text, str):
        return None
    try:
        return parse_timestamp_ns(text)
    except ValueError:
        return None


def assignment_annotations(gpus: Iterable[str], at_ns: int) -> dict[str, str]:
    """What the extender's Binding carries: the chosen GPUs and when they were chosen."""
    return {
        ANNOTATION_ASSIGNED_GPUS: encode_assigned_gpus(gpus),
        ANNOTATION_ASSIGNED_AT: encode_timestamp(at_ns),
    }


def encode_container_gpus(gpus: ContainerGpus) -> str:
    """The `baton.dev/container-gpus` value: compact JSON, keys sorted."""
    return json.dumps({c: list(g) for c, g in sorted(gpus.items())}, separators=(",", ":"))


def decode_container_gpus(text: str | None) -> dict[str, tuple[str, ...]]:
    """The `baton.dev/container-gpus` value; empty when absent or malformed (it is rewritten)."""
    if not text:
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        str(c): tuple(sorted(str(g) for g in gpus))
        for c, gpus in data.items()
        if isinstance(gpus, list)
    }


@dataclass(frozen=True, slots=True)
class PodAssignment:
    """What a pod's Baton annotations say about its GPUs."""

    assigned_gpus: tuple[str, ...] = ()
    """The extender's proposal, corrected by the device plugin to the kubelet's choice."""
    assigned_at_ns: int | None = None
    allocated_at_ns: int | None = None
    allocated: bool = False
    """The device plugin has recorded the kubelet's allocation."""
    container_gpus: ContainerGpus = field(default_factory=dict)
    """The kubelet's allocation per container (empty until recorded)."""


def decode_parking(annotations: Mapping[str, str]) -> str:
    """The parking method a pod asks for (`baton.dev/parking`), lower-cased; empty if none.

    An unknown method is kept as written: the agent refuses to park the pod and says why."""
    return (annotations.get(ANNOTATION_PARKING) or "").strip().lower()


def pod_assignment(annotations: Mapping[str, str]) -> PodAssignment:
    """A pod's Baton annotations, decoded."""
    return PodAssignment(
        assigned_gpus=decode_assigned_gpus(annotations.get(ANNOTATION_ASSIGNED_GPUS)),
        assigned_at_ns=decode_timestamp(annotations.get(ANNOTATION_ASSIGNED_AT)),
        allocated_at_ns=decode_timestamp(annotations.get(ANNOTATION_ALLOCATED_AT)),
        allocated=ANNOTATION_ALLOCATED_AT in annotations,
        container_gpus=decode_container_gpus(annotations.get(ANNOTATION_CONTAINER_GPUS)),
    )

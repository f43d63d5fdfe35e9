"""The node's GPUs and their health: what both kubelet-facing daemons advertise.

Pure: no sockets, clocks or API calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from baton.contract import names
from baton.contract.annotations import GpuRecord


@dataclass(frozen=True)
class NodeGpu:
    """One physical GPU of this node, as NVML (or the fake GPUs' spec) describes it."""

    uuid: str
    index: int
    model: str
    memory_mib: int


@dataclass(frozen=True)
class Device:
    """One slot device as the kubelet sees it."""

    id: str
    gpu: str
    healthy: bool


@dataclass(frozen=True)
class Inventory:
    """The node's GPUs, the slots advertised per GPU, and which GPUs are unhealthy (and why)."""

    gpus: tuple[NodeGpu, ...]
    slots_per_gpu: int
    unhealthy: Mapping[str, str] = field(default_factory=dict)

    def devices(self) -> list[Device]:
        """Every slot device, GPUs in index order, slots in order."""
        return [
            Device(names.slot_device_id(gpu.uuid, slot), gpu.uuid, gpu.uuid not in self.unhealthy)
            for gpu in sorted(self.gpus, key=lambda g: g.index)
            for slot in range(self.slots_per_gpu)
        ]

    def healthy_gpus(self) -> list[NodeGpu]:
        """GPUs not marked unhealthy, in index order."""
        return [g for g in sorted(self.gpus, key=lambda g: g.index) if g.uuid not in self.unhealthy]

    def with_health(self, uuid: str, healthy: bool, reason: str = "") -> Inventory:
        """A copy with one GPU's health changed (unknown UUIDs raise KeyError)."""
        if uuid not in {g.uuid for g in self.gpus}:
            raise KeyError(f"no GPU with UUID {uuid} on this node")
        unhealthy = dict(self.unhealthy)
        if healthy:
            unhealthy.pop(uuid, None)
        else:
            unhealthy[uuid] = reason or "unhealthy"
        return replace(self, unhealthy=unhealthy)

    def records(self) -> tuple[GpuRecord, ...]:
        """The GPUs as the `baton.dev/gpus` node annotation lists them, in index order."""
        return tuple(
            GpuRecord(
                g.uuid,
                g.index,
                g.model,
                g.memory_mib,
                self.slots_per_gpu,
                g.uuid not in self.unhealthy,
            )
            for g in sorted(self.gpus, key=lambda g: g.index)
        )

"""Pure: the ResourceSlice that publishes a node's GPUs to the scheduler, and its capacities.

One device per GPU (`gpu-<index>`), shared by many claims (`allowMultipleAllocations`), with
three consumable capacities. Baton's rules on the device-plugin path carry over:

- `memory`: a tenant may ask at most the GPU's memory (the agent gives each turn the whole GPU
  if needed); the total is the GPU's memory times the slots, because memory beside the GPU's
  is parked in host DRAM between turns (the extender gates the node's host-DRAM worst case).
  A share that names none gets the GPU's memory, as `baton.dev/gpu` alone means on the
  device-plugin path.
- `duty`: 100 per GPU; default 100 / slots, as the extender assumes for a pod naming none.
- `slots`: tenants per GPU; each share takes exactly one.

An unhealthy GPU stays listed with a NoSchedule taint naming why: running pods keep it, no new
claim gets it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from baton.contract import names
from baton.contract.quantity import parse_quantity
from nodegpu.inventory import Inventory, NodeGpu

TAINT_UNHEALTHY = f"{names.DRA_DRIVER}/unhealthy"
API_VERSION = "resource.k8s.io/v1"


def slice_name(node_name: str) -> str:
    """The one slice of this driver on `node_name`."""
    return f"{node_name}-{names.DRA_DRIVER}"


def device(gpu: NodeGpu, slots: int, unhealthy: str | None) -> dict[str, Any]:
    """One GPU as a shareable device with its attributes and consumable capacities."""
    memory = gpu.memory_mib * names.MIB
    body: dict[str, Any] = {
        "name": names.dra_device_name(gpu.index),
        "allowMultipleAllocations": True,
        "attributes": {
            names.DRA_ATTRIBUTE_UUID: {"string": gpu.uuid},
            "index": {"int": gpu.index},
            "model": {"string": gpu.model},
            "memory": {"int": memory},
        },
        "capacity": {
            names.DRA_CAPACITY_MEMORY: {
                "value": str(memory * slots),
                "requestPolicy": {
                    "default": str(memory),
                    "validRange": {"min": str(names.MIB), "max": str(memory)},
                },
            },
            names.DRA_CAPACITY_DUTY: {
                "value": "100",
                "requestPolicy": {
                    "default": str(max(1, 100 // slots)),
                    "validRange": {"min": "1", "max": "100"},
                },
            },
            names.DRA_CAPACITY_SLOTS: {
                "value": str(slots),
                "requestPolicy": {"default": "1", "validValues": ["1"]},
            },
        },
    }
    if unhealthy is not None:
        body["taints"] = [
            {"key": TAINT_UNHEALTHY, "value": "true", "effect": "NoSchedule"},
        ]
    return body


def resource_slice(
    node_name: str, inventory: Inventory, generation: int, node_uid: str = ""
) -> dict[str, Any]:
    """The whole slice body for `node_name` (pool = node name), at pool `generation`.

    With the node's UID the slice is owned by the node, so it goes when the node does.
    """
    gpus = sorted(inventory.gpus, key=lambda g: g.index)
    body = {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node_name)},
        "spec": {
            "driver": names.DRA_DRIVER,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": generation, "resourceSliceCount": 1},
            "devices": [
                device(g, inventory.slots_per_gpu, inventory.unhealthy.get(g.uuid)) for g in gpus
            ],
        },
    }
    owned_by(body, node_uid)
    return body


def owned_by(body: dict[str, Any], node_uid: str) -> None:
    """Make the node with `node_uid` the owner of slice `body` (none for '')."""
    meta = body["metadata"]
    meta.pop("ownerReferences", None)
    if node_uid:
        node_name = body["spec"]["nodeName"]
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid}
        ]


def keep_taint_times(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> None:
    """Give `wanted`'s taints the `timeAdded` the API server stamped on the same taints of
    `current` (it adds one to every taint without): the taint keeps the time it was added,
    and a slice whose devices did not change compares the same."""
    added = {
        (d.get("name"), t.get("key"), t.get("value"), t.get("effect")): t["timeAdded"]
        for d in (current.get("spec") or {}).get("devices") or []
        for t in d.get("taints") or []
        if t.get("timeAdded")
    }
    for d in (wanted.get("spec") or {}).get("devices") or []:
        for t in d.get("taints") or []:
            when = added.get((d.get("name"), t.get("key"), t.get("value"), t.get("effect")))
            if when and "timeAdded" not in t:
                t["timeAdded"] = when


def same_devices(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether a slice already publishes what `wanted` would (generation aside), capacities
    compared as numbers: the API server writes a quantity back in its canonical form
    (`67108864000` as `67108864k`)."""
    return _comparable(current) == _comparable(wanted)


def _comparable(body: Mapping[str, Any]) -> list[Any]:
    """A slice's devices with every capacity quantity parsed."""
    devices = (body.get("spec") or {}).get("devices") or []
    return [
        {**d, "capacity": _quantities(d.get("capacity"))} if isinstance(d, Mapping) else d
        for d in devices
    ]


def _quantities(value: Any) -> Any:
    """`value` with every string in it that is a quantity made its number."""
    if isinstance(value, Mapping):
        return {k: _quantities(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_quantities(v) for v in value]
    if isinstance(value, str):
        try:
            return parse_quantity(value)
        except ValueError:
            return value
    return value

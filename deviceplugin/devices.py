"""Pure device-plugin logic: which pod an Allocate serves, fallback GPUs, the preferred choice.

No sockets, clocks or API calls: callers pass in snapshots and the current time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from baton.contract import names
from nodegpu.inventory import Inventory

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
_ACTIVE_PHASES = ("", "Pending")


@dataclass(frozen=True)
class PodView:
    """What the device plugin needs to know about one pod on its node."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    phase: str
    gpu_request: int
    assigned_gpus: tuple[str, ...]
    assigned_at_ns: int | None
    allocated: bool
    created_ns: int
    deleting: bool = False
    slot_asks: tuple[int, ...] = ()
    """Each GPU container's (init containers too) `baton.dev/gpu` request, in admission order."""
    container_gpus: Mapping[str, tuple[str, ...]] = field(default_factory=dict, hash=False)
    """The `baton.dev/container-gpus` annotation: what the kubelet allocated, per container."""

    @property
    def key(self) -> str:
        """`namespace/name`."""
        return f"{self.namespace}/{self.name}"

    @property
    def waiting(self) -> bool:
        """Not yet allocated, not terminal, not being deleted."""
        return not self.allocated and not self.deleting and self.phase in _ACTIVE_PHASES

    @property
    def holds_gpus(self) -> bool:
        """Counts towards its GPUs' load (assigned and not terminal)."""
        return bool(self.assigned_gpus) and self.phase not in ("Succeeded", "Failed")


@dataclass(frozen=True)
class Choice:
    """The pod a preferred allocation steers for and its GPUs; `fallback`: it had none assigned."""

    pod: PodView
    gpus: tuple[str, ...]
    fallback: bool


class NoHealthyGpuError(Exception):
    """Every GPU of the node is unhealthy."""


def _order(pod: PodView) -> tuple[int, int, str]:
    assigned = pod.assigned_at_ns if pod.assigned_at_ns is not None else pod.created_ns
    return (assigned, pod.created_ns, pod.key)


def choose_pod(
    pods: Iterable[PodView],
    device_count: int,
    inventory: Inventory,
    exclude: Iterable[str] = (),
) -> Choice | None:
    """The pod a container asking for `device_count` devices most likely belongs to, or None.

    A guess (the kubelet does not say which pod it admits): pods assigned GPUs of this node
    first, oldest assignment first; else the oldest other pod (an assignment naming no GPU of
    this node, malformed or stale, counts as none), with the least-loaded GPUs. Pods whose UID
    is in `exclude` were already steered for.
    """
    skip = set(exclude)
    all_pods = list(pods)
    candidates = [
        p
        for p in all_pods
        if p.waiting
        and p.uid not in skip
        and (p.gpu_request == device_count or device_count in p.slot_asks)
    ]
    here = {g.uuid for g in inventory.gpus}

    def on_node(pod: PodView) -> tuple[str, ...]:
        return tuple(g for g in pod.assigned_gpus if g in here)

    assigned = sorted((p for p in candidates if on_node(p)), key=_order)
    if assigned:
        return Choice(assigned[0], on_node(assigned[0]), fallback=False)
    unassigned = sorted(candidates, key=_order)
    if not unassigned:
        return None
    gpus = least_loaded_gpus(inventory, all_pods, device_count)
    return Choice(unassigned[0], gpus, fallback=True)


def least_loaded_gpus(inventory: Inventory, pods: Iterable[PodView], count: int) -> tuple[str, ...]:
    """`count` distinct healthy GPUs with the fewest pods assigned (ties: lowest index)."""
    healthy = inventory.healthy_gpus()
    if not healthy:
        raise NoHealthyGpuError("every GPU on this node is unhealthy")
    load = {g.uuid: 0 for g in healthy}
    for pod in pods:
        if pod.holds_gpus:
            for uuid in pod.assigned_gpus:
                if uuid in load:
                    load[uuid] += 1
    ranked = sorted(healthy, key=lambda g: (load[g.uuid], g.index))
    return tuple(g.uuid for g in ranked[: max(count, 1)])


def preferred_allocation(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    prefer_gpus: Sequence[str] = (),
) -> list[str]:
    """The slot devices to suggest: `must_include`, then one slot on each GPU not yet chosen,
    `prefer_gpus` first (in their order), then those with the most free slots; only when every
    GPU has one a second slot of a GPU (`prefer_gpus` first): a container asking for N slots
    means N GPUs, also when fewer of its assigned GPUs have a free slot."""
    chosen = list(dict.fromkeys(must_include))
    free: dict[str, list[str]] = {}
    for device in available:
        if device not in chosen:
            free.setdefault(names.gpu_of_device_id(device), []).append(device)
    preferred = [g for g in dict.fromkeys(prefer_gpus) if g in free]
    others = sorted((g for g in free if g not in preferred), key=lambda g: -len(free[g]))
    used = {names.gpu_of_device_id(d) for d in chosen}
    for gpu in preferred + others:
        if gpu not in used and len(chosen) < size:
            chosen.append(free[gpu].pop(0))
            used.add(gpu)
    for gpu in preferred + sorted(others, key=lambda g: -len(free[g])):
        while free[gpu] and len(chosen) < size:
            chosen.append(free[gpu].pop(0))
    return chosen

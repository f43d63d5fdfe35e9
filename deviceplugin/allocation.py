"""Serving GetPreferredAllocation and Allocate: steer towards the proposal, answer from the IDs.

Allocate does not say which pod it is for, and the kubelet admits pods in its own order, one
container at a time. So Allocate answers from the device IDs it is given (a container's GPUs are
its slots' GPUs), and which pod got them is read back from the kubelet's PodResources API
(`reconcile.py`). GetPreferredAllocation only steers: towards the GPUs the extender assigned to
the pod most likely being admitted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from baton.contract import names
from deviceplugin.devices import (
    Choice,
    NoHealthyGpuError,
    PodView,
    choose_pod,
    preferred_allocation,
)
from deviceplugin.errors import DevicePluginError
from nodegpu.container import ContainerAllocation, container_allocation
from nodegpu.state import LiveInventory

log = logging.getLogger(__name__)
_REMEMBERED_PODS = 4096
RELIST_PAUSE_S = 30.0
"""After a failed steering list, steer from the cached pods only for this long: the kubelet
admits one container at a time, and each would wait for the list's timeout (5 s) again."""


class PodSource(Protocol):
    """Where pods come from and where their annotations go (the watch-fed cache)."""

    def pods(self) -> list[PodView]:
        """Cached pods of this node, without an API call."""

    def relist(self) -> list[PodView]:
        """One list call (on a cache miss)."""

    def annotate(
        self, pod: PodView, annotations: Mapping[str, str], *, check_version: bool = False
    ) -> PodView:
        """Write annotations on the pod; return the updated pod."""


class Allocator:
    """Answers the kubelet's allocation calls; `on_allocate` is told after every Allocate."""

    def __init__(
        self,
        source: PodSource,
        inventory: LiveInventory,
        node_name: str,
        cdi_kind: str | None = None,
        on_allocate: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.inventory = inventory
        self.node_name = node_name
        self.cdi_kind = cdi_kind
        self.on_allocate = on_allocate
        self._clock = clock
        self._lock = threading.Lock()
        self._relist_after = float("-inf")
        """No steering list before this time (`clock`): the last one failed."""
        self._steered: dict[str, int] = {}
        """Pod UID → slots steered for it so far; -1 once all its asks were (the hint moves on)."""

    def _steer_for(self, size: int) -> Choice | None:
        """The pod a container asking `size` slots most likely belongs to (a guess).

        The kubelet admits a pod as soon as its own watch shows it bound, which can be before
        ours does: when the cache has no assigned pod waiting, one list of the node's pods
        looks again (else the container would be steered to no GPU, or another pod's).
        """
        _, inventory = self.inventory.snapshot()
        done = [uid for uid, n in self._steered.items() if n < 0]
        choice = choose_pod(self.source.pods(), size, inventory, done)
        if (choice is None or choice.fallback) and self._clock() >= self._relist_after:
            try:
                pods = self.source.relist()
            except Exception as err:  # an unreachable API server or an unreadable answer
                self._relist_after = self._clock() + RELIST_PAUSE_S
                log.info(
                    "steering from the cached pods only, listing again in %g s at the earliest: %s",
                    RELIST_PAUSE_S,
                    err,
                )
            else:
                choice = choose_pod(pods, size, inventory, done) or choice
        if choice is None:
            return None
        uid = choice.pod.uid
        steered = self._steered.get(uid, 0)
        if uid not in self._steered and len(self._steered) >= _REMEMBERED_PODS:
            self._steered.pop(next(iter(self._steered)))
        total = steered + size
        self._steered[uid] = -1 if total >= sum(choice.pod.slot_asks or (size,)) else total
        turn = steered % len(choice.gpus)
        gpus = choice.gpus[turn:] + choice.gpus[:turn]
        return Choice(choice.pod, gpus, choice.fallback)

    def preferred(self, available: Sequence[str], must: Sequence[str], size: int) -> list[str]:
        """`must`, then slots on the GPUs of the pod most likely admitted, else the fewest."""
        with self._lock:
            try:
                choice = self._steer_for(size)
            except (NoHealthyGpuError, DevicePluginError) as err:
                log.info("no preferred GPUs (%s); packing onto the fewest", err)
                choice = None
        prefer = choice.gpus if choice is not None else ()
        return preferred_allocation(available, must, size, prefer)

    def allocate(self, device_ids: Sequence[str]) -> ContainerAllocation:
        """The container's setup for the GPUs of its allocated slots (the kubelet's choice)."""
        gpus = names.gpus_of_device_ids(device_ids)
        if not gpus:
            raise ValueError("Allocate named no devices")
        _, inventory = self.inventory.snapshot()
        advertised = {d.id for d in inventory.devices()}
        unknown = [d for d in device_ids if d not in advertised]
        if unknown:  # a container would be handed a GPU this node does not have
            raise ValueError(
                f"devices {', '.join(unknown)} are not advertised on node {self.node_name} "
                f"({len(inventory.gpus)} GPUs, slots 0 to {inventory.slots_per_gpu - 1} each)"
            )
        self.on_allocate()
        log.info("allocated GPUs %s (devices %s)", ",".join(gpus), ",".join(device_ids))
        return container_allocation(gpus, self.cdi_kind)

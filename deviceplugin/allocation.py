"""Serving GetPreferredAllocation and Allocate: pick the pod, answer, mark it allocated."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Literal, Protocol

from baton import names
from baton.kube import format_timestamp_ns
from deviceplugin.devices import (
    Choice,
    ContainerAllocation,
    NoHealthyGpuError,
    PodView,
    allocation_annotations,
    choose_pod,
    container_allocation,
    preferred_allocation,
)
from deviceplugin.errors import ConflictError, DevicePluginError, NoWaitingPodError
from deviceplugin.metrics import Metrics
from deviceplugin.state import LiveInventory

log = logging.getLogger(__name__)
_REMEMBERED_PODS = 4096
Relist = Literal["miss", "now"]


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
    """Matches kubelet allocation calls to pods; one Allocate at a time."""

    def __init__(
        self,
        source: PodSource,
        inventory: LiveInventory,
        metrics: Metrics,
        clock_ns: Callable[[], int],
        node_name: str,
        cdi_kind: str | None = None,
    ) -> None:
        self.source = source
        self.inventory = inventory
        self.metrics = metrics
        self.clock_ns = clock_ns
        self.node_name = node_name
        self.cdi_kind = cdi_kind
        self._lock = threading.Lock()
        self._served: deque[str] = deque(maxlen=_REMEMBERED_PODS)

    def _choose(self, count: int, relist: Relist) -> Choice | None:
        """From the cache; `relist` "miss": list once if the cache has none, "now": list first."""
        _, inventory = self.inventory.snapshot()
        pods = self.source.relist() if relist == "now" else self.source.pods()
        choice = choose_pod(pods, count, inventory, self._served)
        if choice is None and relist == "miss":
            choice = choose_pod(self.source.relist(), count, inventory, self._served)
        return choice

    def _claim(self, count: int, relist: Relist) -> Choice:
        """Choose the pod and annotate it allocated."""
        choice = self._choose(count, relist)
        if choice is None:
            raise NoWaitingPodError(
                f"no pod on node {self.node_name} waits for {count} {names.RESOURCE_GPU} "
                "(none is Pending, unallocated and asks for exactly that many); "
                "was it deleted meanwhile?"
            )
        now = format_timestamp_ns(self.clock_ns())
        annotations = allocation_annotations(choice, now)
        self.source.annotate(choice.pod, annotations, check_version=choice.fallback)
        self._served.append(choice.pod.uid)
        return choice

    def preferred(self, available: Sequence[str], must: Sequence[str], size: int) -> list[str]:
        """Slots on the GPUs of the pod about to be admitted, else the fewest GPUs."""
        with self._lock:
            try:
                choice = self._choose(size, relist="miss")
            except (NoHealthyGpuError, DevicePluginError) as err:
                log.info("no preferred GPUs (%s); packing onto the fewest", err)
                choice = None
        prefer = choice.gpus if choice is not None else ()
        return preferred_allocation(available, must, size, prefer)

    def allocate(self, device_ids: Sequence[str]) -> ContainerAllocation:
        """Find the pod these devices are for, annotate it allocated, return its container setup."""
        with self._lock:
            try:
                choice = self._claim(len(device_ids), relist="miss")
            except ConflictError as err:
                log.info("%s; listing the node's pods and trying once more", err)
                choice = self._claim(len(device_ids), relist="now")
        if choice.fallback:
            self.metrics.fallbacks.inc()
            log.warning(
                "pod %s reached node %s without a GPU assignment (scheduled without the Baton "
                "extender?); gave it the least-loaded GPUs %s",
                choice.pod.key,
                self.node_name,
                ",".join(choice.gpus),
            )
        log.info("allocated GPUs %s to pod %s", ",".join(choice.gpus), choice.pod.key)
        return container_allocation(choice.gpus, self.cdi_kind)

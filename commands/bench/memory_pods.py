"""An in-memory pod source: the bench's stand-in for the watch-fed cache."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import replace

from baton.contract import names
from baton.contract.annotations import decode_assigned_gpus, decode_container_gpus
from deviceplugin.devices import PodView


class MemoryPods:
    """Pods kept in a dict; `annotate` applies the annotations it understands locally."""

    def __init__(self, pods: Iterable[PodView] = ()) -> None:
        self._pods = {p.uid: p for p in pods}
        self._lock = threading.Lock()
        self.relists = 0

    def add(self, pod: PodView) -> None:
        """Add or replace a pod."""
        with self._lock:
            self._pods[pod.uid] = pod

    def pods(self) -> list[PodView]:
        """Every pod."""
        with self._lock:
            return list(self._pods.values())

    def relist(self) -> list[PodView]:
        """Every pod (counted, as the real cache's fallback list would be)."""
        self.relists += 1
        return self.pods()

    def annotate(
        self, pod: PodView, annotations: Mapping[str, str], *, check_version: bool = False
    ) -> PodView:
        """Apply the GPU annotations: allocated, assigned GPUs, per-container GPUs."""
        gpus = annotations.get(names.ANNOTATION_ASSIGNED_GPUS)
        per_container = annotations.get(names.ANNOTATION_CONTAINER_GPUS)
        with self._lock:
            current = self._pods[pod.uid]
            updated = replace(
                current,
                allocated=names.ANNOTATION_ALLOCATED_AT in annotations or current.allocated,
                assigned_gpus=decode_assigned_gpus(gpus) or current.assigned_gpus,
                container_gpus=decode_container_gpus(per_container)
                if per_container
                else current.container_gpus,
            )
            self._pods[pod.uid] = updated
        return updated

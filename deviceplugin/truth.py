"""The kubelet's allocation is the truth: what a pod's annotations must say, given it. Pure.

The extender proposes GPUs (`baton.dev/assigned-gpus`) and GetPreferredAllocation steers the
kubelet towards them, but the kubelet decides which slot devices each container gets, in its own
admission order. A container's GPUs are its allocated slots' GPUs; the pod's annotations are
corrected to say so (`baton.dev/container-gpus` per container, `baton.dev/assigned-gpus` the
union, which the extender's cache reads).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from baton.contract import names
from baton.contract.annotations import ContainerGpus, encode_assigned_gpus, encode_container_gpus
from deviceplugin.devices import PodView

Outcome = Literal["confirmed", "corrected", "fallback", "unchanged"]


def container_gpus(devices: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """Container name → GPUs, from container name → allocated slot device IDs (none: left out)."""
    return {c: names.gpus_of_device_ids(ids) for c, ids in sorted(devices.items()) if ids}


def union(gpus: ContainerGpus) -> tuple[str, ...]:
    """Every GPU any container of the pod was allocated, sorted."""
    return tuple(sorted({g for each in gpus.values() for g in each}))


@dataclass(frozen=True)
class Reconciliation:
    """The annotations to write (empty: the pod already says the truth) and what happened."""

    annotations: dict[str, str]
    outcome: Outcome
    proposed: tuple[str, ...]
    allocated: tuple[str, ...]


def reconcile(pod: PodView, allocated: ContainerGpus, now: str) -> Reconciliation:
    """What `pod`'s annotations must become, given the kubelet's per-container allocation.

    `confirmed`: the kubelet followed the extender's proposal; `corrected`: it did not, and the
    pod's assigned GPUs are rewritten to the allocated ones; `fallback`: the pod had no proposal
    (scheduled without the extender) and gets one recorded; `unchanged`: nothing to write.
    """
    truth = union(allocated)
    proposed = tuple(sorted(pod.assigned_gpus))
    wanted = {
        names.ANNOTATION_CONTAINER_GPUS: encode_container_gpus(allocated),
        names.ANNOTATION_ASSIGNED_GPUS: encode_assigned_gpus(truth),
    }
    if not pod.allocated:
        wanted[names.ANNOTATION_ALLOCATED_AT] = now
    if not pod.assigned_gpus:
        wanted[names.ANNOTATION_ASSIGNED_AT] = now
    current = {
        names.ANNOTATION_CONTAINER_GPUS: encode_container_gpus(pod.container_gpus),
        names.ANNOTATION_ASSIGNED_GPUS: encode_assigned_gpus(proposed),
    }
    changes = {k: v for k, v in wanted.items() if current.get(k) != v}
    outcome: Outcome
    if not changes:
        outcome = "unchanged"
    elif not pod.assigned_gpus:
        outcome = "fallback"
    elif proposed != truth:
        outcome = "corrected"
    else:
        outcome = "confirmed"
    return Reconciliation(changes, outcome, proposed, truth)

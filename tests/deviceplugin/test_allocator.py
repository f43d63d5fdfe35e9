"""The Allocator over in-process pod sources: the lagging-watch race, fallback list, failures."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest

from baton import names
from baton.bench.memory_pods import MemoryPods
from deviceplugin.allocation import Allocator
from deviceplugin.devices import Gpu, Inventory, PodView
from deviceplugin.errors import ApiUnavailableError, ConflictError, NoWaitingPodError
from deviceplugin.metrics import Metrics
from deviceplugin.state import LiveInventory
from tests.deviceplugin.test_devices import pod

A, B = "GPU-a", "GPU-b"
DEV_A, DEV_B = names.slot_device_id(A, 0), names.slot_device_id(B, 0)


class LaggingWatch(MemoryPods):
    """Annotations reach the API server, but the cache never sees them (a watch far behind)."""

    def __init__(self, pods: list[PodView]) -> None:
        super().__init__(pods)
        self.patched: list[str] = []

    def annotate(
        self, pod: PodView, annotations: Mapping[str, str], *, check_version: bool = False
    ) -> PodView:
        self.patched.append(pod.name)
        return replace(pod, allocated=True)


class Unreachable(MemoryPods):
    """The API server is down for the next `failures` writes."""

    def __init__(self, pods: list[PodView], failures: int) -> None:
        super().__init__(pods)
        self.failures = failures

    def annotate(
        self, pod: PodView, annotations: Mapping[str, str], *, check_version: bool = False
    ) -> PodView:
        if self.failures:
            self.failures -= 1
            raise ApiUnavailableError("the Kubernetes API server is unreachable")
        return super().annotate(pod, annotations, check_version=check_version)


class AssignedMeanwhile(MemoryPods):
    """The extender assigns the pod between our read and our (preconditioned) write."""

    def annotate(
        self, pod: PodView, annotations: Mapping[str, str], *, check_version: bool = False
    ) -> PodView:
        if check_version and pod.resource_version == "1":
            self.add(replace(pod, resource_version="2", assigned_gpus=(A,), assigned_at_ns=9))
            raise ConflictError(f"cannot annotate pod {pod.key}: it changed meanwhile")
        return super().annotate(pod, annotations, check_version=check_version)


def allocator(source: MemoryPods) -> Allocator:
    inventory = LiveInventory(Inventory((Gpu(A, 0, "m", 1), Gpu(B, 1, "m", 1)), 2))
    return Allocator(source, inventory, Metrics(), lambda: 1_700_000_000_000_000_000, "node-a")


def test_back_to_back_admissions_each_get_their_own_pod_while_the_watch_lags():
    source = LaggingWatch([pod("first", gpus=[B], at=1), pod("second", gpus=[A], at=2)])
    served = allocator(source)

    assert served.preferred([DEV_A, DEV_B], [], 1) == [DEV_B]
    assert served.allocate([DEV_B]).envs[names.ENV_GPUS] == B
    assert served.preferred([DEV_A], [], 1) == [DEV_A]
    assert served.allocate([DEV_A]).envs[names.ENV_GPUS] == A
    assert source.patched == ["first", "second"]
    with pytest.raises(NoWaitingPodError):
        served.allocate([DEV_A])


def test_cache_miss_costs_one_list():
    source = MemoryPods()
    served = allocator(source)
    with pytest.raises(NoWaitingPodError, match=r"waits for 1 baton\.dev/gpu"):
        served.allocate([DEV_A])
    assert source.relists == 1
    source.add(pod("late", gpus=[A], at=1))
    served.allocate([DEV_A])
    assert source.relists == 1, "a cache hit lists nothing"


def test_assignment_racing_a_fallback_wins():
    source = AssignedMeanwhile([pod("tenant")])
    served = allocator(source)
    assert served.allocate([DEV_B]).envs[names.ENV_GPUS] == A, "the extender's choice, not B"
    assert source.relists == 1
    fallbacks = served.metrics.registry.get_sample_value(
        "baton_deviceplugin_fallback_assignments_total"
    )
    assert fallbacks == 0


def test_failed_write_leaves_the_pod_waiting_for_the_next_try():
    source = Unreachable([pod("tenant", gpus=[B], at=1)], failures=1)
    served = allocator(source)
    with pytest.raises(ApiUnavailableError):
        served.allocate([DEV_B])
    assert served.allocate([DEV_B]).envs[names.ENV_GPUS] == B
    assert [p.allocated for p in source.pods()] == [True]

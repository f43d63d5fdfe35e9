"""The Allocator and the Reconciler over in-process pod sources: steering, truth, failures."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest

from baton.contract import names
from commands.bench.memory_pods import MemoryPods
from deviceplugin.allocation import RELIST_PAUSE_S, Allocator
from deviceplugin.devices import PodView
from deviceplugin.errors import ApiUnavailableError
from deviceplugin.podresources import Allocations, PodResourcesClient, PodResourcesUnavailableError
from deviceplugin.reconcile import Reconciler
from nodegpu.inventory import Inventory, NodeGpu
from nodegpu.metrics import Metrics
from nodegpu.state import LiveInventory
from tests.deviceplugin.test_devices import pod

A, B = "GPU-a", "GPU-b"
A0, A1, B0, B1 = (names.slot_device_id(g, s) for g in (A, B) for s in (0, 1))
EVERY = [A0, A1, B0, B1]


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


class Kubelet:
    """A PodResources lister returning what the test says the kubelet allocated."""

    def __init__(self) -> None:
        self.allocations: Allocations = {}

    def list(self) -> Allocations:
        return {k: dict(v) for k, v in self.allocations.items()}


def allocator(source: MemoryPods) -> Allocator:
    inventory = LiveInventory(Inventory((NodeGpu(A, 0, "m", 1), NodeGpu(B, 1, "m", 1)), 2))
    return Allocator(source, inventory, "node-a")


def reconciler(source: MemoryPods, kubelet: Kubelet) -> Reconciler:
    return Reconciler(kubelet, source, Metrics(), "node-a", clock_ns=lambda: 1_700_000_000 * 10**9)


def test_allocate_answers_from_the_device_ids_whichever_pod_they_are_for():
    served = allocator(MemoryPods())
    assert served.allocate([B1, A0]).envs[names.ENV_GPUS] == f"{A},{B}"
    assert served.allocate([B1]).envs[names.ENV_NVIDIA_VISIBLE_DEVICES] == B
    with pytest.raises(ValueError, match="<GPU-UUID>::<slot>"):
        served.allocate(["no-slot"])


def test_allocate_refuses_devices_it_does_not_advertise_naming_them():
    served = allocator(MemoryPods())
    with pytest.raises(ValueError, match="devices GPU-gone::0 are not advertised on node node-a"):
        served.allocate([A0, "GPU-gone::0"])
    with pytest.raises(ValueError, match=f"{A}::2 are not .* slots 0 to 1 each"):
        served.allocate([f"{A}::2"])


def test_preferred_steers_each_container_of_the_oldest_pod_then_moves_on():
    pods = [
        pod("second", gpus=[A], at=2),
        replace(pod("first", request=2, gpus=[A, B], at=1), slot_asks=(1, 1)),
    ]
    served = allocator(MemoryPods(pods))
    assert served.preferred(EVERY, [], 1) == [A0], "first's first container: its first GPU"
    assert served.preferred([A1, B0, B1], [], 1) == [B0], "first's second container: the next"
    assert served.preferred([A1, B1], [], 1) == [A1], "then second's GPU"
    assert served.preferred([B1], [], 1) == [B1], "nobody left to steer for: any slot"


def test_reconcile_confirms_corrects_and_records_a_fallback():
    source = MemoryPods([pod("kept", gpus=[A], at=1), pod("moved", gpus=[A], at=2), pod("stray")])
    kubelet = Kubelet()
    kubelet.allocations = {
        ("ns", "kept"): {"main": (A0,)},
        ("ns", "moved"): {"main": (B0,)},
        ("ns", "stray"): {"main": (B1, A1)},
    }
    loop = reconciler(source, kubelet)
    outcomes = {r.outcome for r in loop.reconcile_once()}
    assert outcomes == {"confirmed", "corrected", "fallback"}
    views = {p.name: p for p in source.pods()}
    assert views["moved"].assigned_gpus == (B,) and views["moved"].container_gpus == {"main": (B,)}
    assert views["stray"].assigned_gpus == (A, B)
    assert all(v.allocated for v in views.values())
    assert {r.outcome for r in loop.reconcile_once()} == {"unchanged"}
    assert (
        loop.metrics.registry.get_sample_value("baton_deviceplugin_fallback_assignments_total") == 1
    )


def test_a_failed_write_is_corrected_on_the_next_pass():
    source = Unreachable([pod("tenant", gpus=[A], at=1)], failures=1)
    kubelet = Kubelet()
    kubelet.allocations = {("ns", "tenant"): {"main": (B0,)}}
    loop = reconciler(source, kubelet)
    with pytest.raises(ApiUnavailableError):
        loop.reconcile_once()
    assert [r.outcome for r in loop.reconcile_once()] == ["corrected"]
    assert source.pods()[0].assigned_gpus == (B,)


def test_an_allocation_for_a_pod_the_cache_lacks_costs_one_list():
    source = MemoryPods()
    kubelet = Kubelet()
    kubelet.allocations = {("ns", "late"): {"main": (A0,)}}
    loop = reconciler(source, kubelet)
    assert loop.reconcile_once() == []
    assert source.relists == 1
    source.add(pod("late", gpus=[A], at=1))
    assert [r.outcome for r in loop.reconcile_once()] == ["confirmed"]
    assert source.relists == 1, "a cache hit lists nothing"


def test_a_missing_pod_resources_socket_is_named_in_the_error(tmp_path):
    client = PodResourcesClient(tmp_path / "kubelet.sock")
    try:
        with pytest.raises(PodResourcesUnavailableError, match="pod-resources mounted"):
            client.list()
    finally:
        client.close()


class Lagging(MemoryPods):
    """A watch-fed cache that has not yet shown the pods the API server has (`late`)."""

    def __init__(self, cached: list[PodView], late: list[PodView]) -> None:
        super().__init__(cached)
        self.late = late

    def relist(self) -> list[PodView]:
        for each in self.late:
            self.add(each)
        return super().relist()


def test_preferred_lists_the_pods_when_the_cache_has_none_waiting_for_its_gpus():
    """The kubelet admits the third pod before the plugin's watch shows it bound: steering it
    anyway to the emptiest GPU would undo the extender's packing (the kubelet's choice wins)."""
    source = Lagging([pod("first", gpus=[A], at=1)], [pod("late", gpus=[A], at=2)])
    served = allocator(source)
    assert served.preferred(EVERY, [], 1) == [A0] and source.relists == 0, "a cache hit"
    assert served.preferred([A1, B0, B1], [], 1) == [A1], "late's GPU, found by one list"
    assert source.relists == 1


class Unlistable(MemoryPods):
    """A cache whose fallback list fails (an API server that answers garbage, or none)."""

    def relist(self) -> list[PodView]:
        raise ValueError("Expecting value: line 1 column 1 (char 0)")


def test_preferred_still_answers_when_its_list_fails():
    """A failed list must not fail the pod's admission: the kubelet gets a suggestion anyway."""
    served = allocator(Unlistable([pod("first", gpus=[A], at=1)]))
    assert served.preferred(EVERY, [], 1) == [A0]
    assert len(served.preferred([A1, B0, B1], [], 1)) == 1, "nobody to steer for: any one slot"


class Unanswered(MemoryPods):
    """A cache whose fallback list times out (counted)."""

    def relist(self) -> list[PodView]:
        self.relists += 1
        raise ApiUnavailableError("the Kubernetes API server is unreachable (timed out)")


def test_a_failed_list_pauses_the_steering_lists_for_a_while():
    """Each admission of a pod without an assignment listed the pods: with the API server not
    answering, each waited for the list's timeout. One failure pauses them for RELIST_PAUSE_S."""
    now = [100.0]
    source = Unanswered([pod(f"stray-{i}") for i in range(3)])
    inventory = LiveInventory(Inventory((NodeGpu(A, 0, "m", 1), NodeGpu(B, 1, "m", 1)), 2))
    served = Allocator(source, inventory, "node-a", clock=lambda: now[0])
    for _ in range(3):
        assert len(served.preferred(EVERY, [], 1)) == 1
    assert source.relists == 1
    now[0] += RELIST_PAUSE_S
    served.preferred(EVERY, [], 1)
    assert source.relists == 2, "listed again once the pause is over"

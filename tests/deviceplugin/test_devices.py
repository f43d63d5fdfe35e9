"""Table tests of the pure device logic: slot lists, health, pod choice, preferred allocation."""

from __future__ import annotations

from dataclasses import replace

import pytest

from baton.contract import names
from baton.contract.annotations import decode_container_gpus, encode_container_gpus
from deviceplugin.devices import (
    NoHealthyGpuError,
    PodView,
    choose_pod,
    least_loaded_gpus,
    preferred_allocation,
)
from deviceplugin.truth import container_gpus, reconcile
from nodegpu.container import container_allocation
from nodegpu.inventory import Inventory, NodeGpu

A, B, C = "GPU-a", "GPU-b", "GPU-c"
INV = Inventory((NodeGpu(B, 1, "m", 100), NodeGpu(A, 0, "m", 100), NodeGpu(C, 2, "m", 100)), 2)


def pod(name, request=1, gpus=(), at=None, created=0, allocated=False, phase="Pending", uid=None):
    return PodView(
        namespace="ns",
        name=name,
        uid=uid or f"uid-{name}",
        resource_version="1",
        phase=phase,
        gpu_request=request,
        assigned_gpus=tuple(gpus),
        assigned_at_ns=at,
        allocated=allocated,
        created_ns=created,
    )


def d(gpu, slot):
    return names.slot_device_id(gpu, slot)


def test_devices_are_slots_per_gpu_in_index_order():
    assert [x.id for x in INV.devices()] == [d(A, 0), d(A, 1), d(B, 0), d(B, 1), d(C, 0), d(C, 1)]
    assert all(x.healthy for x in INV.devices())


def test_unhealthy_gpu_marks_only_its_slots():
    sick = INV.with_health(B, False, "XID 79")
    assert {x.id: x.healthy for x in sick.devices()} == {
        d(A, 0): True,
        d(A, 1): True,
        d(B, 0): False,
        d(B, 1): False,
        d(C, 0): True,
        d(C, 1): True,
    }
    assert [g.uuid for g in sick.healthy_gpus()] == [A, C]
    assert sick.with_health(B, True).unhealthy == {}
    assert [r.healthy for r in sick.records()] == [True, False, True]
    with pytest.raises(KeyError):
        INV.with_health("GPU-zzz", False)


@pytest.mark.parametrize(
    ("pods", "count", "exclude", "want_name", "want_gpus", "fallback"),
    [
        # oldest assignment first, whatever the list order
        (
            [pod("late", gpus=[B], at=20), pod("early", gpus=[A], at=10)],
            1,
            (),
            "early",
            (A,),
            False,
        ),
        # the device count must match the pod's request
        ([pod("two", 2, gpus=[A, B], at=1), pod("one", gpus=[C], at=5)], 1, (), "one", (C,), False),
        (
            [pod("two", 2, gpus=[A, B], at=1), pod("one", gpus=[C], at=5)],
            2,
            (),
            "two",
            (A, B),
            False,
        ),
        # allocated, terminal and already-served pods are skipped
        (
            [pod("done", gpus=[A], at=1, allocated=True), pod("x", gpus=[B], at=2)],
            1,
            (),
            "x",
            (B,),
            False,
        ),
        (
            [pod("ran", gpus=[A], at=1, phase="Running"), pod("x", gpus=[B], at=2)],
            1,
            (),
            "x",
            (B,),
            False,
        ),
        ([pod("a", gpus=[A], at=1), pod("b", gpus=[B], at=2)], 1, ("uid-a",), "b", (B,), False),
        # an assigned pod beats an older unassigned one
        (
            [pod("free", created=0), pod("assigned", gpus=[C], at=9, created=5)],
            1,
            (),
            "assigned",
            (C,),
            False,
        ),
        # unassigned: least-loaded GPU (A carries a running pod, B is free)
        (
            [pod("busy", gpus=[A], at=1, allocated=True, phase="Running"), pod("new")],
            1,
            (),
            "new",
            (B,),
            True,
        ),
    ],
)
def test_choose_pod(pods, count, exclude, want_name, want_gpus, fallback):
    choice = choose_pod(pods, count, INV, exclude)
    assert choice is not None
    assert (choice.pod.name, choice.gpus, choice.fallback) == (want_name, want_gpus, fallback)


@pytest.mark.parametrize(
    "pods",
    [[], [pod("x", gpus=[A], at=1, allocated=True)], [pod("two", 2, gpus=[A, B], at=1)]],
)
def test_choose_pod_none_waiting(pods):
    assert choose_pod(pods, 1, INV) is None


def test_least_loaded_skips_unhealthy_and_counts_live_pods():
    pods = [
        pod("p1", gpus=[A], phase="Running", allocated=True),
        pod("p2", gpus=[A], phase="Running", allocated=True),
        pod("p3", gpus=[C], phase="Running", allocated=True),
        pod("gone", gpus=[B], phase="Succeeded", allocated=True),
    ]
    assert least_loaded_gpus(INV, pods, 1) == (B,)
    assert least_loaded_gpus(INV, pods, 2) == (B, C)
    assert least_loaded_gpus(INV.with_health(B, False), pods, 1) == (C,)
    everything_sick = INV.with_health(A, False).with_health(B, False).with_health(C, False)
    with pytest.raises(NoHealthyGpuError):
        least_loaded_gpus(everything_sick, pods, 1)


ALL = [d(g, s) for g in (A, B, C) for s in range(4)]


@pytest.mark.parametrize(
    ("available", "must", "size", "prefer", "want"),
    [
        # the assigned GPU's slot, not the first one offered
        (ALL, [], 1, [C], [d(C, 0)]),
        # two GPUs assigned: one slot on each
        (ALL, [], 2, [B, C], [d(B, 0), d(C, 0)]),
        # no preference: N slots are N GPUs (as the extender places them), fullest first
        ([d(A, 0), d(B, 0), d(B, 1), d(B, 2)], [], 2, [], [d(B, 0), d(A, 0)]),
        # must-include first, then another GPU
        (ALL, [d(C, 3)], 2, [], [d(C, 3), d(A, 0)]),
        # more slots than GPUs with a free slot: only then a second slot of one GPU
        ([d(A, 0), d(B, 0), d(B, 1)], [], 3, [], [d(B, 0), d(A, 0), d(B, 1)]),
        # an assigned GPU has no free slot (unhealthy): the other one, then another GPU
        (ALL[4:], [], 2, [A, B], [d(B, 0), d(C, 0)]),
        # fewer GPUs assigned than slots asked: still one slot per GPU
        (ALL, [], 2, [C], [d(C, 0), d(A, 0)]),
        # must-include already on the assigned GPU: the next slot on another GPU
        (ALL, [d(C, 3)], 2, [C, B], [d(C, 3), d(B, 0)]),
        # the preferred GPU has no free slot left: fall back to packing
        ([d(A, 1), d(B, 0), d(B, 1)], [], 1, [C], [d(B, 0)]),
    ],
)
def test_preferred_allocation(available, must, size, prefer, want):
    assert preferred_allocation(available, must, size, prefer) == want


def test_container_allocation_env_mount_and_cdi():
    plain = container_allocation([A, B])
    assert plain.envs == {
        names.ENV_GPUS: f"{A},{B}",
        names.ENV_NVIDIA_VISIBLE_DEVICES: f"{A},{B}",
        names.ENV_AGENT_SOCKET: names.AGENT_SOCKET,
    }
    assert plain.mounts == ((names.AGENT_SOCKET_DIR, names.AGENT_SOCKET_DIR, True),)
    assert plain.cdi_devices == ()
    cdi = container_allocation([A], "nvidia.com/gpu")
    assert names.ENV_NVIDIA_VISIBLE_DEVICES not in cdi.envs
    assert cdi.cdi_devices == (f"nvidia.com/gpu={A}",)


RECONCILE_CASES = [
    # (assigned, allocated already, container GPUs recorded, kubelet's allocation, outcome, keys)
    ((A,), False, {}, {"main": (A,)}, "confirmed", {"container", "allocated"}),
    ((A,), False, {}, {"main": (B,)}, "corrected", {"container", "assigned", "allocated"}),
    ((), False, {}, {"main": (B,)}, "fallback", {"container", "assigned", "at", "allocated"}),
    ((B,), True, {"main": (B,)}, {"main": (B,)}, "unchanged", set()),
    ((A, B), True, {"x": (A,)}, {"x": (A,), "y": (B,)}, "confirmed", {"container"}),
]
KEYS = {
    "container": names.ANNOTATION_CONTAINER_GPUS,
    "assigned": names.ANNOTATION_ASSIGNED_GPUS,
    "at": names.ANNOTATION_ASSIGNED_AT,
    "allocated": names.ANNOTATION_ALLOCATED_AT,
}


@pytest.mark.parametrize(
    ("assigned", "allocated", "recorded", "kubelet", "outcome", "keys"), RECONCILE_CASES
)
def test_reconcile_makes_the_annotations_say_what_the_kubelet_allocated(
    assigned, allocated, recorded, kubelet, outcome, keys
):
    view = replace(pod("p", gpus=assigned, allocated=allocated), container_gpus=recorded)
    result = reconcile(view, kubelet, "T")
    assert result.outcome == outcome
    assert set(result.annotations) == {KEYS[k] for k in keys}
    if keys:
        written = decode_container_gpus(result.annotations[names.ANNOTATION_CONTAINER_GPUS])
        assert written == kubelet
        assert result.allocated == tuple(sorted({g for gs in kubelet.values() for g in gs}))


def test_container_gpus_round_trip_and_bad_values_read_as_none():
    gpus = container_gpus({"b": (d(B, 1), d(A, 0), d(B, 0)), "a": (d(C, 1),), "none": ()})
    assert gpus == {"a": (C,), "b": (A, B)}
    assert decode_container_gpus(encode_container_gpus(gpus)) == gpus
    assert decode_container_gpus("not json") == {} == decode_container_gpus("[1]")

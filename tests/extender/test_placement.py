"""The placement core, case by case."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from baton.contract.podask import TenantRequest
from extender.placement import (
    GpuRecord,
    Limits,
    PlacedPod,
    Policy,
    Verdict,
    node_state,
    one_gpu_chooser,
    parked_worst_mib,
    place,
)

GIB = 1024
H100 = 80 * GIB


def gpus(n: int = 2, memory: int = H100, slots: int = 4) -> list[GpuRecord]:
    return [GpuRecord(f"GPU-{i}", i, "H100", memory, slots) for i in range(n)]


@dataclass
class Case:
    name: str
    request: TenantRequest
    tenants: dict[str, list[PlacedPod]] = field(default_factory=dict)
    gpus: list[GpuRecord] = field(default_factory=gpus)
    budget: int = 256 * GIB
    limits: Limits = field(default_factory=Limits)
    fits: bool = True
    chosen: tuple[str, ...] = ()
    reason: str = ""
    unresolvable: bool = False


def t(key: str, memory: int | None = None, duty: float | None = None) -> PlacedPod:
    return PlacedPod(key, memory, duty)


CASES = [
    Case("empty node takes one GPU", TenantRequest(1, 40 * GIB, 50), chosen=("GPU-0",)),
    Case(
        "binpack fills the GPU that has tenants",
        TenantRequest(1, 10 * GIB, 10),
        tenants={"GPU-1": [t("a", 10 * GIB, 10)]},
        chosen=("GPU-1",),
    ),
    Case(
        "spread prefers the empty GPU",
        TenantRequest(1, 10 * GIB, 10),
        tenants={"GPU-0": [t("a", 10 * GIB, 10)]},
        limits=Limits(Policy.SPREAD),
        chosen=("GPU-1",),
    ),
    Case(
        "complement prefers the GPU that gets closest to 100%",
        TenantRequest(1, 10 * GIB, 40),
        gpus=gpus(3),
        tenants={
            "GPU-0": [t("a", duty=30)],
            "GPU-1": [t("b", duty=60)],
            "GPU-2": [t("c", duty=70)],
        },
        limits=Limits(Policy.COMPLEMENT),
        chosen=("GPU-1",),
    ),
    Case(
        "memory above every GPU can never fit",
        TenantRequest(1, 90000),
        fits=False,
        unresolvable=True,
        reason="gpu-memory 90000 MiB exceeds every GPU on this node (81920 MiB)",
    ),
    Case(
        "container memory limit below gpu-memory can never fit",
        TenantRequest(1, 40 * GIB, memory_limit_bytes=32 * GIB * 2**20),
        fits=False,
        unresolvable=True,
        reason="container memory limit 32 GiB cannot hold the 40 GiB of GPU memory it may park",
    ),
    Case(
        "more GPUs than the node has can never fit",
        TenantRequest(3),
        fits=False,
        unresolvable=True,
        reason="asks for 3 GPUs; this node has 2",
    ),
    Case(
        "duty over the limit names the GPU and the sum",
        TenantRequest(1, 1 * GIB, 50),
        gpus=gpus(1),
        tenants={"GPU-0": [t("a", GIB, 80)]},
        fits=False,
        reason="no GPU can take it: GPU-0 summed duty would be 130 percent > 100 percent",
    ),
    Case(
        "omitted duty is 100 / slots",
        TenantRequest(1, GIB),
        gpus=gpus(1, slots=4),
        tenants={"GPU-0": [t("a", GIB), t("b", GIB)]},
        fits=False,
        reason="GPU-0 summed duty would be 75 percent > 70 percent",
        limits=Limits(max_duty=70),
    ),
    Case(
        "no free slot",
        TenantRequest(1, GIB, 1),
        gpus=gpus(1, slots=2),
        tenants={"GPU-0": [t("a", GIB, 1), t("b", GIB, 1)]},
        fits=False,
        reason="GPU-0 has no free slot (2/2 taken)",
    ),
    Case(
        "unhealthy GPU is skipped",
        TenantRequest(1, GIB, 10),
        gpus=[GpuRecord("GPU-0", 0, "H100", H100, 4, healthy=False), *gpus(2)[1:]],
        chosen=("GPU-1",),
    ),
    Case(
        "parked worst case over the host budget",
        TenantRequest(1, 60 * GIB, 10),
        gpus=gpus(1),
        tenants={"GPU-0": [t("a", 60 * GIB, 10), t("b", 60 * GIB, 10)]},
        budget=100 * GIB,
        fits=False,
        reason="parked worst case 120 GiB > host budget 100 GiB",
    ),
    Case(
        "budget steers the choice to the GPU where nothing must park",
        TenantRequest(1, 60 * GIB, 10),
        tenants={"GPU-0": [t("a", 60 * GIB, 10)], "GPU-1": [t("b", 10 * GIB, 10)]},
        budget=30 * GIB,
        chosen=("GPU-1",),
    ),
    Case(
        "two GPUs for a two-GPU pod",
        TenantRequest(2, GIB, 10),
        gpus=gpus(3),
        tenants={"GPU-1": [t("a", GIB, 10)], "GPU-2": [t("b", GIB, 10)]},
        chosen=("GPU-1", "GPU-2"),
    ),
    Case(
        "headroom shrinks the usable memory",
        TenantRequest(1, 80 * GIB),
        limits=Limits(memory_headroom_mib=1024),
        fits=False,
        unresolvable=True,
        reason="exceeds every GPU on this node (80896 MiB)",
    ),
    Case(
        "a headroom at the GPUs' memory leaves them no room (a whole-GPU pod fitted as 0 MiB)",
        TenantRequest(1),
        limits=Limits(memory_headroom_mib=H100),
        fits=False,
        unresolvable=True,
        reason="asks for 1 GPU; 0 on this node have memory beyond --memory-headroom 81920 MiB",
    ),
    Case(
        "a GPU the headroom takes whole is passed over",
        TenantRequest(1),
        gpus=[GpuRecord("GPU-0", 0, "T4", 16 * GIB, 4), GpuRecord("GPU-1", 1, "H100", H100, 4)],
        limits=Limits(memory_headroom_mib=16 * GIB),
        chosen=("GPU-1",),
    ),
    Case(
        "too few GPUs with memory beyond the headroom",
        TenantRequest(2),
        gpus=[GpuRecord("GPU-0", 0, "T4", 16 * GIB, 4), GpuRecord("GPU-1", 1, "H100", H100, 4)],
        limits=Limits(memory_headroom_mib=20 * GIB),
        fits=False,
        unresolvable=True,
        reason="asks for 2 GPUs; 1 on this node has memory beyond --memory-headroom 20480 MiB",
    ),
    Case(
        "a GPU the headroom takes whole says so when the others are full",
        TenantRequest(1),
        gpus=[GpuRecord("GPU-0", 0, "T4", 16 * GIB, 4), GpuRecord("GPU-1", 1, "H100", H100, 1)],
        tenants={"GPU-1": [t("a", GIB)]},
        limits=Limits(memory_headroom_mib=16 * GIB),
        fits=False,
        reason=(
            "no GPU can take it: GPU-0 has no usable memory (16384 MiB, --memory-headroom"
            " 16384 MiB); GPU-1 has no free slot (1/1 taken)"
        ),
    ),
    Case(
        "no budget annotation means nothing may park",
        TenantRequest(1, 50 * GIB, 10),
        gpus=gpus(1),
        tenants={"GPU-0": [t("a", 50 * GIB, 10)]},
        budget=0,
        fits=False,
        reason=(
            "parked worst case 50 GiB > host budget 0 GiB"
            " (the node's baton.dev/host-memory-budget is 0 or missing)"
        ),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_placement(case: Case) -> None:
    node = node_state("n1", case.gpus, case.budget, case.tenants, case.limits)
    verdict = place(node, case.request, case.limits)
    assert verdict.fits is case.fits, verdict
    assert case.reason in verdict.reason
    assert verdict.unresolvable is case.unresolvable
    if case.chosen:
        assert verdict.gpus == case.chosen
    if case.fits:
        assert 0 <= verdict.score <= 10


def test_scores_order_nodes_by_policy() -> None:
    busy = node_state("busy", gpus(1), 0, {"GPU-0": [t("a", GIB, 20)]}, Limits())
    idle = node_state("idle", gpus(1), 0, {}, Limits())
    request = TenantRequest(1, GIB, 20)
    for policy, better in ((Policy.BINPACK, busy), (Policy.SPREAD, idle)):
        limits = Limits(policy)
        scores = {n.name: place(n, request, limits).score for n in (busy, idle)}
        assert scores[better.name] == max(scores.values())
        assert len(set(scores.values())) == 2


def test_node_without_gpus_or_with_a_broken_annotation_says_so() -> None:
    assert place(node_state("n", [], 0, {}, Limits()), TenantRequest(1), Limits()) == Verdict(
        False, "node advertises no Baton GPUs"
    )
    broken = node_state("n", [], 0, {}, Limits(), problem="annotation unreadable")
    assert place(broken, TenantRequest(1), Limits()).reason == "annotation unreadable"


@pytest.mark.parametrize(
    ("memories", "usable", "worst"),
    [
        ([], 100, 0),
        ([40, 60], 100, 0),
        ([50, 40, 30], 80, 90),
        ([80, 80], 80, 80),
        ([10, 10, 10, 90], 100, 110),
    ],
)
def test_parked_worst_case(memories: list[int], usable: int, worst: int) -> None:
    smallest, largest = (min(memories), max(memories)) if memories else (0, 0)
    assert parked_worst_mib(sum(memories), smallest, largest, usable) == worst


def test_a_node_already_over_a_lowered_budget_takes_no_one() -> None:
    crowded = {"GPU-0": [t("a", 60 * GIB, 10), t("b", 60 * GIB, 10)]}
    node = node_state("n", gpus(2), 10 * GIB, crowded, Limits())
    request = TenantRequest(1, GIB, 10)
    verdict = place(node, request, Limits())
    assert verdict == Verdict(False, "parked worst case 60 GiB > host budget 10 GiB")
    assert not place(node, request, Limits(), choose=False).fits
    assert one_gpu_chooser(request, Limits())(node) is None

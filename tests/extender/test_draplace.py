"""Placement on the DRA path, case by case: the GPU the scheduler takes, Baton's rules there."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from baton.contract.podask import TenantRequest
from extender.draplace import Share, first_fit, place_claim
from extender.placement import GpuRecord, Limits, PlacedPod, Policy, node_state

GIB = 1024
H100 = 80 * GIB


def gpus(n: int = 2, memory: int = H100, slots: int = 4) -> list[GpuRecord]:
    return [GpuRecord(f"GPU-{i}", i, "H100", memory, slots) for i in range(n)]


def t(key: str, memory: int | None = None, duty: float | None = None) -> PlacedPod:
    return PlacedPod(key, memory, duty)


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
    score: int | None = None
    reason: str = ""


CASES = [
    Case("an empty node: the first GPU", TenantRequest(1, 30 * GIB, 30), chosen=("GPU-0",)),
    Case(
        "the scheduler's first fit, not the policy's best GPU",
        TenantRequest(1, 10 * GIB, 10),
        tenants={"GPU-1": [t("a", 10 * GIB, 10)]},
        chosen=("GPU-0",),
    ),
    Case(
        "a GPU whose duty capacity is spent is passed over",
        TenantRequest(1, 10 * GIB, 30),
        tenants={"GPU-0": [t("a", duty=80)]},
        chosen=("GPU-1",),
    ),
    Case(
        "an unhealthy GPU is passed over",
        TenantRequest(1, 10 * GIB, 30),
        gpus=[GpuRecord("GPU-0", 0, "H100", H100, 4, healthy=False), *gpus(2)[1:]],
        chosen=("GPU-1",),
    ),
    Case(
        "host DRAM: the parked worst case on the GPU the scheduler takes passes the budget",
        TenantRequest(1, 30 * GIB, 30),
        tenants={"GPU-0": [t("a", 60 * GIB, 30), t("b", 60 * GIB, 30)]},
        budget=70 * GIB,
        fits=False,
        reason="the scheduler would allocate gpu-0 (GPU-0): parked worst case would be"
        " 120 GiB > host budget 70 GiB (host DRAM)",
    ),
    Case(
        "host DRAM counts the node's other GPUs' parked worst case",
        TenantRequest(1, 30 * GIB, 10),
        tenants={
            "GPU-0": [t("c", 60 * GIB, 30)],
            "GPU-1": [t("a", 60 * GIB, 30), t("b", 60 * GIB, 30)],
        },
        budget=70 * GIB,
        fits=False,
        reason="the scheduler would allocate gpu-0 (GPU-0): parked worst case would be"
        " 120 GiB > host budget 70 GiB (host DRAM)",
    ),
    Case(
        "within the budget it fits",
        TenantRequest(1, 30 * GIB, 30),
        tenants={"GPU-0": [t("a", 60 * GIB, 30), t("b", 60 * GIB, 30)]},
        budget=120 * GIB,
        chosen=("GPU-0",),
    ),
    Case(
        "Baton's duty limit holds on the device DRA takes",
        TenantRequest(1, 10 * GIB, 30),
        tenants={"GPU-0": [t("a", duty=60)]},
        limits=Limits(max_duty=80),
        fits=False,
        reason="the scheduler would allocate gpu-0 (GPU-0): no GPU can take it:"
        " GPU-0 summed duty would be 90 percent > 80 percent",
    ),
    Case(
        "complement scores the duty the pod brings the GPU to",
        TenantRequest(1, 10 * GIB, 40),
        tenants={"GPU-0": [t("a", duty=60)]},
        limits=Limits(Policy.COMPLEMENT),
        chosen=("GPU-0",),
        score=10,
    ),
    Case(
        "complement on an idle GPU scores lower",
        TenantRequest(1, 10 * GIB, 40),
        limits=Limits(Policy.COMPLEMENT),
        chosen=("GPU-0",),
        score=4,
    ),
    Case(
        "two GPUs: the first two that fit",
        TenantRequest(2, 10 * GIB, 30),
        gpus=gpus(3),
        tenants={"GPU-0": [t("a", duty=80)]},
        chosen=("GPU-1", "GPU-2"),
    ),
    Case(
        "a node without Baton GPUs",
        TenantRequest(1, 10 * GIB, 30),
        gpus=[],
        fits=False,
        reason="node advertises no Baton GPUs",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_place_claim(case: Case) -> None:
    node = node_state("n1", case.gpus, case.budget, case.tenants, case.limits)
    verdict = place_claim(node, case.request, case.limits)
    assert verdict.fits == case.fits, verdict.reason
    assert "%" not in verdict.reason  # kube-scheduler formats reasons as a format string
    if case.fits:
        assert verdict.gpus == case.chosen
        if case.score is not None:
            assert verdict.score == case.score
    else:
        assert verdict.reason == case.reason


def test_first_fit_is_index_order_whatever_the_annotation_order() -> None:
    node = node_state("n1", list(reversed(gpus(3))), 256 * GIB, {}, Limits())
    assert [g.gpu.uuid for g in first_fit(node, TenantRequest(2, GIB, 10))] == ["GPU-0", "GPU-1"]


def test_two_requests_of_one_pod_share_the_first_gpu_that_still_fits_both() -> None:
    node = node_state("n1", gpus(2), 256 * GIB, {"GPU-0": [t("a", duty=40)]}, Limits())
    request = TenantRequest(2, 10 * GIB, 30)
    both = (Share(1, 10 * GIB, 30), Share(1, 10 * GIB, 30))
    verdict = place_claim(node, request, Limits(), both)
    assert (verdict.fits, verdict.gpus) == (True, ("GPU-0",))
    apart = (Share(1, 10 * GIB, 30), Share(1, 10 * GIB, 40))  # 40 + 30 + 40 > 100
    assert [g.gpu.uuid for g in first_fit(node, request, apart)] == ["GPU-0", "GPU-1"]
    # One request's GPUs are distinct: a count of 2 takes two GPUs.
    assert [g.gpu.uuid for g in first_fit(node, request, (Share(2, GIB, 10),))] == [
        "GPU-0",
        "GPU-1",
    ]

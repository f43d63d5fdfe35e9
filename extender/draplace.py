"""Placement on the DRA path: the GPU the scheduler will take, judged by Baton's rules. Pure.

kube-scheduler allocates a claim the first devices of the node's slice (GPU index order) whose
capacity fits: the one fit rule (`extender.fit`) with the slice's capacities as its ceilings
(the GPU's whole memory, summed duty within 100, no memory-limit cap). The
extender cannot steer that choice, so it predicts it and asks `place` whether Baton's rules
(memory headroom, the duty limit, the node's parked-memory worst case in host DRAM) hold there.
"""

from __future__ import annotations

from collections.abc import Callable

from baton.contract.names import dra_device_name
from baton.contract.podask import TenantRequest
from extender.fit import NO_CAP, Ask, takes
from extender.placement import (
    GpuLoad,
    Limits,
    NodeState,
    PlacedPod,
    Verdict,
    gpu_load,
    host_budget,
    node_state,
    place,
    remembered,
)

DRA_DUTY = 100.0
"""The `duty` capacity the driver publishes per GPU."""


def first_fit(node: NodeState, request: TenantRequest) -> tuple[GpuLoad, ...]:
    """The GPUs the scheduler would allocate: the first, in index order, whose capacity fits."""
    ask = Ask(request.memory_mib, request.duty, NO_CAP, DRA_DUTY)
    picked: list[GpuLoad] = []
    for load in sorted(node.gpus, key=lambda g: g.gpu.index):
        if not takes(ask, load, load.gpu.memory_mib):
            continue
        picked.append(load)
        if len(picked) == request.gpus:
            break
    return tuple(picked)


def claim_judge(request: TenantRequest, limits: Limits) -> Callable[[NodeState], Verdict]:
    """`place_claim` for one request, remembered per node state: filter's answers serve
    prioritize, and the next pod of the same shape on every node the last bind did not change."""
    shape = (  # plain values, hashed in C on every lookup
        "claim",
        request.gpus,
        request.memory_mib,
        request.duty,
        request.memory_limit_bytes,
        limits.policy.value,
        limits.max_duty,
        limits.memory_headroom_mib,
    )

    def answer(node: NodeState) -> Verdict:
        return place_claim(node, request, limits)

    def judge(node: NodeState) -> Verdict:
        return remembered(node, shape, answer)

    return judge


def place_claim(node: NodeState, request: TenantRequest, limits: Limits) -> Verdict:
    """Whether the pod may go to the node, on the GPUs the scheduler would allocate, and the
    policy's score there."""
    if node.problem:
        return Verdict(False, node.problem)
    if not node.gpus:
        return Verdict(False, "node advertises no Baton GPUs")
    picked = first_fit(node, request)
    if len(picked) < request.gpus:
        return Verdict(
            False, f"no {request.gpus} Baton GPUs of this node have the capacity its claims ask"
        )
    others = node.parked_worst_mib - sum(p.parked_worst_mib for p in picked)
    alone = node_state(
        node.name,
        [p.gpu for p in picked],
        node.budget_mib - others,
        {p.gpu.uuid: p.tenants_in for p in picked},
        limits,
    )
    verdict = place(alone, request, limits, choose=True)
    if verdict.fits:
        return verdict
    devices = ", ".join(f"{dra_device_name(p.gpu.index)} ({p.gpu.uuid})" for p in picked)
    newcomer = PlacedPod("", request.memory_mib, request.duty)
    worst = others + sum(
        gpu_load(p.gpu, (*p.tenants_in, newcomer), limits).parked_worst_mib for p in picked
    )
    if worst > node.budget_mib:
        why = (
            f"parked worst case would be {_gib(worst)} > {host_budget(node.budget_mib)} (host DRAM)"
        )
    else:
        why = verdict.reason
    return Verdict(False, f"the scheduler would allocate {devices}: {why}")


def _gib(mib: int) -> str:
    return f"{round(mib / 1024, 1):g} GiB"

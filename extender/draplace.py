"""Placement on the DRA path: the GPU the scheduler will take, judged by Baton's rules. Pure.

kube-scheduler allocates a claim the first devices of the node's slice (GPU index order) whose
capacity fits: the one fit rule (`extender.fit`) with the slice's capacities as its ceilings
(the GPU's whole memory, summed duty within 100, no memory-limit cap). The
extender cannot steer that choice, so it predicts it and asks `place` whether Baton's rules
(memory headroom, the duty limit, the node's parked-memory worst case in host DRAM) hold there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

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


@dataclass(frozen=True, slots=True)
class Share:
    """One device request of a pod's claims: `count` GPUs, each giving the pod a share."""

    count: int
    memory_mib: int | None = None
    duty: float | None = None


Shares = tuple[Share, ...]


def first_fit(
    node: NodeState, request: TenantRequest, shares: Sequence[Share] = ()
) -> tuple[GpuLoad, ...]:
    """The GPUs the scheduler would allocate, in index order: for each of the pod's device
    requests (`shares`; none given: one asking `request`), the first GPUs by index whose
    capacity fits, with what the pod's earlier requests took. A GPU allows several allocations,
    so two requests (two claims) of one pod may be given the same GPU; one request's are
    distinct."""
    return _allocate(node, _requests(request, shares))[0]


def _requests(request: TenantRequest, shares: Sequence[Share]) -> Sequence[Share]:
    """The pod's device requests: `shares`, or, none given, one asking `request`."""
    return shares or (Share(request.gpus, request.memory_mib, request.duty),)


def _allocate(node: NodeState, shares: Sequence[Share]) -> tuple[tuple[GpuLoad, ...], bool]:
    """`first_fit`'s GPUs, and whether every request got all its GPUs."""
    order = sorted(node.gpus, key=lambda g: g.gpu.index)
    taken: dict[str, tuple[int, float]] = {}
    """GPU UUID -> the shares the pod's earlier requests took there, and their summed duty."""
    more = {load.gpu.uuid: _more_shares(load) for load in order}
    """GPU UUID -> the shares its tenants hold beyond the one each counts as, and their duty."""
    complete = True
    for share in shares:
        ask = Ask(share.memory_mib, share.duty, NO_CAP, DRA_DUTY)
        found = 0
        for load in order:
            count, duty = taken.get(load.gpu.uuid, (0, 0.0))
            extra, extra_duty = more[load.gpu.uuid]
            now = load
            if count or extra:
                slots_free = len(load.tenants) + extra + count < load.gpu.slots
                now = replace(
                    load,
                    duty_sum=load.duty_sum + extra_duty + duty,
                    open=load.gpu.healthy and slots_free,
                )
            if not takes(ask, now, load.gpu.memory_mib):
                continue
            added = load.default_duty if share.duty is None else share.duty
            taken[load.gpu.uuid] = (count + 1, duty + added)
            found += 1
            if found == share.count:
                break
        complete = complete and found == share.count
    picked = tuple(load for load in order if load.gpu.uuid in taken)
    return picked, complete


def _more_shares(load: GpuLoad) -> tuple[int, float]:
    """The slots and duty the GPU's tenants' further shares take of the slice's capacity: a
    pod holding several shares of it counts once as a tenant, but the scheduler counts each."""
    device, count, duty = dra_device_name(load.gpu.index), 0, 0.0
    for tenant in load.tenants_in:
        for name, duties in tenant.several:
            if name == device:
                counted = load.default_duty if tenant.duty is None else tenant.duty
                count += len(duties) - 1
                duty += sum(load.default_duty if d is None else d for d in duties) - counted
    return count, duty


def claim_judge(
    request: TenantRequest, limits: Limits, shares: Shares = ()
) -> Callable[[NodeState], Verdict]:
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
        shares,
    )

    def answer(node: NodeState) -> Verdict:
        return place_claim(node, request, limits, shares)

    def judge(node: NodeState) -> Verdict:
        return remembered(node, shape, answer)

    return judge


def place_claim(
    node: NodeState, request: TenantRequest, limits: Limits, shares: Sequence[Share] = ()
) -> Verdict:
    """Whether the pod may go to the node, on the GPUs the scheduler would allocate, and the
    policy's score there. `shares`: the pod's device requests (none: one asking `request`); on
    each GPU they give it, the pod is one tenant with `request`'s memory and duty."""
    if node.problem:
        return Verdict(False, node.problem)
    if not node.gpus:
        return Verdict(False, "node advertises no Baton GPUs")
    picked, complete = _allocate(node, _requests(request, shares))
    if not complete:
        return Verdict(
            False, f"no {request.gpus} Baton GPUs of this node have the capacity its claims ask"
        )
    request = replace(request, gpus=len(picked))
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

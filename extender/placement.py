"""Placement: whether, where and how well a tenant fits on a node. Pure: no I/O, no clock.

Whether a GPU can take a tenant, and what it costs the node's host DRAM budget, is the one fit
rule (`extender.fit`), with the GPU's usable memory (size minus headroom) as its capacity and
the extender's duty limit as its cap. A node can take it when enough of its GPUs can and its
parked-memory worst case (see `extender.snapshot`) stays within its host DRAM budget. Among
the GPUs that can, the policy's key picks (and scores) the best; `binpack` fills GPUs with
tenants, `spread` prefers idle ones, `complement` brings summed duty closest to the limit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, TypeVar

from baton.contract.names import ANNOTATION_HOST_MEMORY_BUDGET, MIB
from baton.contract.podask import TenantRequest
from extender.fit import EPSILON, plain_ask, room, row_fit
from extender.snapshot import (
    GpuLoad,
    GpuRecord,
    Limits,
    NodeState,
    PlacedPod,
    Policy,
    gpu_load,
    node_state,
    parked_worst_mib,
)
from extender.wire import MAX_PRIORITY, MIN_PRIORITY

__all__ = [
    "GpuLoad",
    "GpuRecord",
    "Limits",
    "NodeState",
    "PlacedPod",
    "Policy",
    "Verdict",
    "gpu_load",
    "node_state",
    "one_gpu_chooser",
    "parked_worst_mib",
    "place",
]


class Verdict(NamedTuple):
    """The answer for one node: where the tenant goes and how well, or why not."""

    fits: bool
    reason: str = ""
    unresolvable: bool = False
    gpus: tuple[str, ...] = ()
    score: int = 0


class _Candidate(NamedTuple):
    """A GPU that can take the tenant; tuples order by (score key, summed duty, -index)."""

    key: float
    duty_after: float
    neg_index: int
    parked_delta_mib: int
    uuid: str


def place(node: NodeState, request: TenantRequest, limits: Limits, choose: bool = True) -> Verdict:
    """Whether the tenant fits on the node; with `choose`, also on which GPUs and the score.

    Without `choose` (filter), the answer comes as soon as enough GPUs are found.
    """
    if node.problem:
        return Verdict(False, node.problem)
    if not node.gpus:
        return Verdict(False, "node advertises no Baton GPUs")
    never = _never_fits(node, request, limits)
    if never:
        return Verdict(False, never, unresolvable=True)
    if choose and request.gpus == 1:
        best = one_gpu_chooser(request, limits)(node)
        if best is not None:
            return Verdict(True, gpus=(best[0],), score=best[1])
    candidates, enough = _candidates(node, request, limits, choose)
    if enough:
        return Verdict(True, gpus=tuple(c.uuid for c in candidates))
    if len(candidates) < request.gpus:
        return Verdict(False, _too_few(node, request, limits, len(candidates)))
    return _choose(node, candidates, request.gpus)


def _candidates(
    node: NodeState, request: TenantRequest, limits: Limits, choose: bool
) -> tuple[list[_Candidate], bool]:
    """The GPUs that can take the tenant; without `choose`, stops (True) once enough fit."""
    found: list[_Candidate] = []
    want, left, spent = request.gpus, room(node), 0
    ask = plain_ask(request, limits)
    max_duty = limits.max_duty
    policy = limits.policy
    for row in node.rows:
        fit = row_fit(row, ask)
        if fit is None:
            continue
        after, delta = fit
        if not choose:
            found.append(_Candidate(0.0, after, 0, delta, row.uuid))
            spent += delta
            if len(found) == want and spent <= left:
                return found, True
            continue
        if policy is Policy.BINPACK:
            key = row.binpack_key
        elif policy is Policy.SPREAD:
            key = 1.0 - max(row.taken_share, min(row.duty_sum / max_duty, 1.0))
        else:
            key = min(after / max_duty, 1.0)
        found.append(_Candidate(key, after, row.neg_index, delta, row.uuid))
    return found, False


def _refusal(state: GpuLoad, request: TenantRequest, limits: Limits) -> str:
    """Why a GPU cannot take the tenant, in words (only asked once the node has failed)."""
    gpu = state.gpu
    memory = state.usable_mib if request.memory_mib is None else request.memory_mib
    duty = state.default_duty if request.duty is None else request.duty
    limit = request.memory_limit_bytes
    if not gpu.healthy:
        return f"{gpu.uuid} is unhealthy"
    if state.usable_mib <= 0:
        return (
            f"{gpu.uuid} has no usable memory ({gpu.memory_mib} MiB, --memory-headroom"
            f" {limits.memory_headroom_mib} MiB)"
        )
    if memory > state.usable_mib:
        return f"gpu-memory {memory} MiB exceeds {gpu.uuid} ({state.usable_mib} MiB)"
    if limit is not None and memory * request.gpus * MIB > limit:
        return f"{gpu.uuid} needs {memory} MiB parked per GPU, over the container memory limit"
    if len(state.tenants) >= gpu.slots:
        return f"{gpu.uuid} has no free slot ({len(state.tenants)}/{gpu.slots} taken)"
    if state.duty_sum + duty > limits.max_duty + EPSILON:
        return (
            f"{gpu.uuid} summed duty would be {_pct(state.duty_sum + duty)}"
            f" > {_pct(limits.max_duty)}"
        )
    return ""


def _never_fits(node: NodeState, request: TenantRequest, limits: Limits) -> str:
    count = request.gpus
    if count > len(node.gpus):
        return f"asks for {count} GPUs; this node has {len(node.gpus)}"
    usable = node.usable_desc
    if usable[count - 1] <= 0:  # the headroom keeps all of the rest free: nothing fits there
        left = sum(1 for mib in usable if mib > 0)
        return (
            f"asks for {_count(count, 'GPU')}; {left} on this node {'has' if left == 1 else 'have'}"
            f" memory beyond --memory-headroom {limits.memory_headroom_mib} MiB"
        )
    if request.memory_mib is not None and request.memory_mib > usable[count - 1]:
        where = "every GPU" if count == 1 else f"all but {_count(count - 1, 'GPU')}"
        return (
            f"gpu-memory {request.memory_mib} MiB exceeds {where} on this node"
            f" ({usable[count - 1]} MiB)"
        )
    limit = request.memory_limit_bytes
    if limit is not None:
        per_gpu = request.memory_mib if request.memory_mib is not None else usable[-1]
        parked = per_gpu * count * MIB
        if limit < parked:
            return (
                f"container memory limit {_gib(limit // MIB)} cannot hold the {_gib(parked // MIB)}"
                f" of GPU memory it may park (gpu-memory {per_gpu} MiB x {_count(count, 'GPU')})"
            )
    return ""


def _choose(node: NodeState, candidates: list[_Candidate], count: int) -> Verdict:
    """The best-scoring GPUs whose parked memory fits the budget, else the thriftiest set."""
    left = room(node)
    chosen: list[_Candidate] = []
    for candidate in sorted(candidates, reverse=True):
        if candidate.parked_delta_mib <= left:
            chosen.append(candidate)
            left -= candidate.parked_delta_mib
            if len(chosen) == count:
                return _chosen(chosen)
    thrifty = sorted(candidates, key=lambda c: (c.parked_delta_mib, -c.key, -c.duty_after))
    chosen = thrifty[:count]
    worst = node.parked_worst_mib + sum(c.parked_delta_mib for c in chosen)
    if worst > node.budget_mib:
        return Verdict(False, f"parked worst case {_gib(worst)} > {host_budget(node.budget_mib)}")
    return _chosen(chosen)


def _chosen(chosen: list[_Candidate]) -> Verdict:
    score = _score(sum(c.key for c in chosen) / len(chosen))
    return Verdict(True, gpus=tuple(c.uuid for c in chosen), score=score)


def _score(key: float) -> int:
    """A policy key (0 to 1) as the priority kube-scheduler takes from an extender."""
    return max(MIN_PRIORITY, min(MAX_PRIORITY, round(MAX_PRIORITY * key)))


_UNSEEN = object()
_SHAPES_KEPT = 64
"""Request shapes a node state keeps answers for; more (a stream of odd sizes) start afresh."""
T = TypeVar("T")


def remembered(node: NodeState, shape: object, answer: Callable[[NodeState], T]) -> T:
    """`answer(node)` for a request of this `shape`, computed once per node state.

    Pods come in few shapes, and a bind changes one node: most answers are known. A state never
    changes (a change makes a new one), so an answer holds as long as the state does.
    """
    known = node.choices.get(shape, _UNSEEN)
    if known is not _UNSEEN:
        return known  # type: ignore[return-value]
    found = answer(node)
    if len(node.choices) >= _SHAPES_KEPT:
        node.choices.clear()
    node.choices[shape] = found
    return found


def one_gpu_chooser(
    request: TenantRequest, limits: Limits
) -> Callable[[NodeState], tuple[str, int] | None]:
    """Filter's and prioritize's fast path for one-GPU pods: a node's best GPU and score, None
    if none fits.

    It agrees with `place`: the GPU with the best policy key among those the pod fits and whose
    parked memory stays within the budget.
    """
    ask = plain_ask(request, limits)
    max_duty = limits.max_duty
    binpack, spread = limits.policy is Policy.BINPACK, limits.policy is Policy.SPREAD
    shape = (*ask, limits.policy.value)  # plain values

    def choose(node: NodeState) -> tuple[str, int] | None:
        return remembered(node, shape, fresh)

    def fresh(node: NodeState) -> tuple[str, int] | None:
        left = room(node)
        if left < 0:
            return None
        best_key, best_after, best_index, best_uuid = -1.0, 0.0, 0, ""
        for row in node.distinct_rows:
            fit = row_fit(row, ask)
            if fit is None or fit[1] > left:
                continue
            after = fit[0]
            if binpack:
                key = row.binpack_key
            elif spread:
                key = 1.0 - max(row.taken_share, min(row.duty_sum / max_duty, 1.0))
            else:
                key = min(after / max_duty, 1.0)
            if key > best_key or (
                key == best_key
                and (after > best_after or (after == best_after and row.neg_index > best_index))
            ):
                best_key, best_after, best_index, best_uuid = key, after, row.neg_index, row.uuid
        if not best_uuid:
            return None
        return best_uuid, _score(best_key)

    return choose


def _too_few(node: NodeState, request: TenantRequest, limits: Limits, found: int) -> str:
    count = request.gpus
    refusals = [r for r in (_refusal(s, request, limits) for s in node.gpus) if r]
    shown = "; ".join(refusals[:3])
    more = f"; and {len(refusals) - 3} more" if len(refusals) > 3 else ""
    if count == 1:
        return f"no GPU can take it: {shown}{more}"
    return f"needs {count} GPUs, {found} can take it: {shown}{more}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _pct(value: float) -> str:
    # No "%": kube-scheduler passes failure reasons to its event recorder as a format string,
    # so "120% > 100%" reached `kubectl describe pod` as "120%!>(MISSING) 100%!(MISSING)".
    return f"{round(value, 1):g} percent"


def _gib(mib: int) -> str:
    return f"{round(mib / 1024, 1):g} GiB"


def host_budget(mib: int) -> str:
    """The node's host DRAM budget as a refusal names it; a zero one says where it comes from."""
    if mib > 0:
        return f"host budget {_gib(mib)}"
    return f"host budget 0 GiB (the node's {ANNOTATION_HOST_MEMORY_BUDGET} is 0 or missing)"

"""Placement: whether, where and how well a tenant fits on a node. Pure: no I/O, no clock.

A GPU can take a tenant when it is healthy, has a free slot, the tenant's `gpu-memory` fits
the GPU's usable memory (size minus headroom), and the summed `gpu-duty` stays within the limit.
A node can take it when enough of its GPUs can and its parked-memory worst case stays within
its host DRAM budget.

Parked-memory worst case of one GPU: 0 while all its tenants fit in memory together (nothing
ever has to move); otherwise `total - max(smallest, usable - largest)`. The agent parks
least-recently-used residents only until the incoming tenant fits, so what stays resident is
at least the incoming tenant and more than `usable` minus the last tenant parked. A node's
worst case is the sum over its GPUs; it must not exceed the budget.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from baton.names import MIB
from extender.requests import TenantRequest

_EPSILON = 1e-9
_MEMO_SIZE = 64


class Policy(StrEnum):
    """How prioritize ranks nodes and bind picks GPUs."""

    BINPACK = "binpack"
    """Fill GPUs that already have tenants."""
    SPREAD = "spread"
    """Prefer the least loaded GPUs."""
    COMPLEMENT = "complement"
    """Prefer the GPU whose summed duty gets closest to the limit without passing it."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Policy and limits, set by the extender's flags."""

    policy: Policy = Policy.BINPACK
    max_duty: float = 100.0
    """Highest summed `gpu-duty` per GPU, percent."""
    memory_headroom_mib: int = 0
    """Memory kept free on every GPU (CUDA contexts, fragmentation)."""


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU as the device plugin advertises it."""

    uuid: str
    index: int
    model: str
    memory_mib: int
    slots: int
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class Tenant:
    """A pod assigned to a GPU; `None` values take the GPU's defaults."""

    key: str
    memory_mib: int | None = None
    duty: float | None = None


@dataclass(frozen=True, slots=True)
class GpuState:
    """A GPU with its tenants and the totals placement needs."""

    gpu: Gpu
    usable_mib: int
    tenants: tuple[str, ...]
    memory_total: int
    memory_min: int
    memory_max: int
    duty_sum: float
    parked_worst_mib: int


@dataclass(frozen=True)
class NodeState:
    """A node's GPUs, tenants and host budget, precomputed for fast placement."""

    name: str
    gpus: tuple[GpuState, ...]
    budget_mib: int
    parked_worst_mib: int
    problem: str = ""
    """Why the node's inventory could not be read, if it could not."""
    memo: dict[tuple[TenantRequest, Limits], Verdict] = field(
        default_factory=dict, compare=False, repr=False
    )


@dataclass(frozen=True, slots=True)
class Verdict:
    """The answer for one node: where the tenant goes and how well, or why not."""

    fits: bool
    reason: str = ""
    unresolvable: bool = False
    gpus: tuple[str, ...] = ()
    score: int = 0


@dataclass(frozen=True, slots=True)
class _Candidate:
    state: GpuState
    memory_mib: int
    key: tuple[float, float, int]
    parked_delta_mib: int


def parked_worst_mib(total: int, smallest: int, largest: int, usable: int) -> int:
    """The most memory one GPU's tenants can have parked at once (see the module docstring)."""
    if total <= usable:
        return 0
    return total - max(smallest, usable - largest)


def gpu_state(gpu: Gpu, tenants: Sequence[Tenant], limits: Limits) -> GpuState:
    """A GPU's state with the given tenants (defaults resolved for this GPU)."""
    usable = max(gpu.memory_mib - limits.memory_headroom_mib, 0)
    memory = [usable if t.memory_mib is None else t.memory_mib for t in tenants]
    default_duty = 100.0 / gpu.slots if gpu.slots else 100.0
    duty = sum(default_duty if t.duty is None else t.duty for t in tenants)
    total = sum(memory)
    smallest, largest = (min(memory), max(memory)) if memory else (0, 0)
    return GpuState(
        gpu=gpu,
        usable_mib=usable,
        tenants=tuple(t.key for t in tenants),
        memory_total=total,
        memory_min=smallest,
        memory_max=largest,
        duty_sum=duty,
        parked_worst_mib=parked_worst_mib(total, smallest, largest, usable),
    )


def node_state(
    name: str,
    gpus: Sequence[Gpu],
    budget_mib: int,
    tenants_by_gpu: Mapping[str, Sequence[Tenant]],
    limits: Limits,
    problem: str = "",
) -> NodeState:
    """A node's state; tenants of GPUs the node does not list are ignored."""
    states = tuple(gpu_state(g, tenants_by_gpu.get(g.uuid, ()), limits) for g in gpus)
    parked = sum(s.parked_worst_mib for s in states)
    return NodeState(name, states, budget_mib, parked, problem)


def place(node: NodeState, request: TenantRequest, limits: Limits) -> Verdict:
    """Whether the tenant fits on the node, on which GPUs, with what score (0-10)."""
    memo_key = (request, limits)
    verdict = node.memo.get(memo_key)
    if verdict is None:
        verdict = _place(node, request, limits)
        if len(node.memo) >= _MEMO_SIZE:
            node.memo.clear()
        node.memo[memo_key] = verdict
    return verdict


def _place(node: NodeState, request: TenantRequest, limits: Limits) -> Verdict:
    if node.problem:
        return Verdict(False, node.problem)
    if not node.gpus:
        return Verdict(False, "node advertises no Baton GPUs")
    never = _never_fits(node, request)
    if never:
        return Verdict(False, never, unresolvable=True)
    candidates: list[_Candidate] = []
    refusals: list[str] = []
    for state in node.gpus:
        outcome = _candidate(state, request, limits)
        if isinstance(outcome, str):
            refusals.append(outcome)
        else:
            candidates.append(outcome)
    if len(candidates) < request.gpus:
        return Verdict(False, _too_few(request.gpus, len(candidates), refusals))
    return _choose(node, candidates, request.gpus)


def _never_fits(node: NodeState, request: TenantRequest) -> str:
    count = request.gpus
    if count > len(node.gpus):
        return f"asks for {count} GPUs; this node has {len(node.gpus)}"
    usable = sorted((s.usable_mib for s in node.gpus), reverse=True)
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


def _candidate(state: GpuState, request: TenantRequest, limits: Limits) -> _Candidate | str:
    gpu = state.gpu
    if not gpu.healthy:
        return f"{gpu.uuid} is unhealthy"
    memory = state.usable_mib if request.memory_mib is None else request.memory_mib
    if memory > state.usable_mib:
        return f"gpu-memory {memory} MiB exceeds {gpu.uuid} ({state.usable_mib} MiB)"
    limit = request.memory_limit_bytes
    if limit is not None and memory * request.gpus * MIB > limit:
        return f"{gpu.uuid} needs {memory} MiB parked per GPU, over the container memory limit"
    taken = len(state.tenants)
    if taken >= gpu.slots:
        return f"{gpu.uuid} has no free slot ({taken}/{gpu.slots} taken)"
    duty = request.duty if request.duty is not None else 100.0 / gpu.slots
    after = state.duty_sum + duty
    if after > limits.max_duty + _EPSILON:
        return f"{gpu.uuid} summed duty would be {_pct(after)} > {_pct(limits.max_duty)}"
    parked = parked_worst_mib(
        state.memory_total + memory,
        min(state.memory_min, memory) if taken else memory,
        max(state.memory_max, memory),
        state.usable_mib,
    )
    key = (_policy_key(limits, state, duty), after, -gpu.index)
    return _Candidate(state, memory, key, parked - state.parked_worst_mib)


def _policy_key(limits: Limits, state: GpuState, duty: float) -> float:
    slots = state.gpu.slots
    taken = len(state.tenants)
    if limits.policy is Policy.BINPACK:
        return (taken + 1) / slots
    if limits.policy is Policy.SPREAD:
        return 1.0 - max(taken / slots, min(state.duty_sum / limits.max_duty, 1.0))
    return min((state.duty_sum + duty) / limits.max_duty, 1.0)


def _choose(node: NodeState, candidates: list[_Candidate], count: int) -> Verdict:
    room = node.budget_mib - node.parked_worst_mib
    chosen = sorted(candidates, key=lambda c: c.key, reverse=True)[:count]
    if sum(c.parked_delta_mib for c in chosen) > room:
        chosen = sorted(candidates, key=lambda c: (c.parked_delta_mib, [-k for k in c.key]))
        chosen = chosen[:count]
        worst = node.parked_worst_mib + sum(c.parked_delta_mib for c in chosen)
        if worst > node.budget_mib:
            return Verdict(
                False,
                f"parked worst case {_gib(worst)} > host budget {_gib(node.budget_mib)}",
            )
    score = round(10 * sum(c.key[0] for c in chosen) / count)
    uuids = tuple(c.state.gpu.uuid for c in chosen)
    return Verdict(True, gpus=uuids, score=max(0, min(10, score)))


def _too_few(count: int, found: int, refusals: list[str]) -> str:
    shown = "; ".join(refusals[:3])
    more = f"; and {len(refusals) - 3} more" if len(refusals) > 3 else ""
    if count == 1:
        return f"no GPU can take it: {shown}{more}"
    return f"needs {count} GPUs, {found} can take it: {shown}{more}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _pct(value: float) -> str:
    return f"{round(value, 1):g}%"


def _gib(mib: int) -> str:
    return f"{round(mib / 1024, 1):g} GiB"

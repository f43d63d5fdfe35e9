"""A node snapshot for placement: its GPUs, their tenants and precomputed totals. Pure.

Parked-memory worst case of one GPU: 0 while all its tenants fit in memory together (nothing
ever has to move); otherwise `total - max(smallest, usable - largest)`. The agent parks
least-recently-used residents only until the incoming tenant fits, so what stays resident is
at least the incoming tenant and more than `usable` minus the last tenant parked. A node's
worst case is the sum over its GPUs; it must not exceed the node's host DRAM budget.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from baton.contract.annotations import GpuRecord


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
class PlacedPod:
    """A pod placed on a GPU, as placement counts it; `None` values take the GPU's defaults."""

    key: str
    memory_mib: int | None = None
    duty: float | None = None
    several: tuple[tuple[str, tuple[float | None, ...]], ...] = ()
    """On the DRA path, each device (`gpu-<index>`) where the pod holds several shares, and
    their duties: the scheduler counts every share's duty and slot (`draplace`)."""


@dataclass(frozen=True, slots=True)
class GpuLoad:
    """A GPU with the pods placed on it and the totals placement needs."""

    gpu: GpuRecord
    usable_mib: int
    tenants: tuple[str, ...]
    memory_total: int
    memory_min: int
    memory_max: int
    duty_sum: float
    parked_worst_mib: int
    default_duty: float
    """`gpu-duty` of a tenant that names none: 100 / slots."""
    open: bool
    """Healthy with a free slot."""
    binpack_key: float
    """Share of the slots taken once one more tenant joins."""
    tenants_in: tuple[PlacedPod, ...] = field(default=(), compare=False, repr=False)
    """The tenants it was made with (what `node_state` reuses it by)."""


@dataclass(frozen=True)
class NodeState:
    """A node's GPUs, tenants and host budget, precomputed for fast placement."""

    name: str
    gpus: tuple[GpuLoad, ...]
    budget_mib: int
    parked_worst_mib: int
    usable_desc: tuple[int, ...]
    """Usable memory of its GPUs, largest first."""
    rows: tuple[Row, ...]
    """The open GPUs' figures as plain tuples, for the hot loop."""
    distinct_rows: tuple[Row, ...]
    """One row per set of GPUs in the same state (the lowest index of each): a one-GPU pod
    fares the same on any of them, so its fast paths look at these only."""
    problem: str = ""
    """Why the node's inventory could not be read, if it could not."""
    choices: dict[object, object] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )
    """Placement answers for this state, by request shape (`placement.remembered`: the one-GPU
    fast path, the DRA path's verdicts): the state never changes (a change makes a new one, and
    never inherits these), so an answer holds as long as the state does."""


class Row(NamedTuple):
    """An open GPU's figures as a plain tuple, for the placement hot loops."""

    usable: int
    duty_sum: float
    default_duty: float
    memory_total: int
    memory_min: int
    memory_max: int
    parked: int
    has_tenants: bool
    binpack_key: float
    taken_share: float
    neg_index: int
    uuid: str


def parked_worst_mib(total: int, smallest: int, largest: int, usable: int) -> int:
    """The most memory one GPU's tenants can have parked at once (see the module docstring)."""
    if total <= usable:
        return 0
    return total - max(smallest, usable - largest)


def gpu_load(gpu: GpuRecord, tenants: Sequence[PlacedPod], limits: Limits) -> GpuLoad:
    """A GPU's state with the given tenants (defaults resolved for this GPU)."""
    usable = max(gpu.memory_mib - limits.memory_headroom_mib, 0)
    memory = [usable if t.memory_mib is None else t.memory_mib for t in tenants]
    default_duty = 100.0 / gpu.slots if gpu.slots else 100.0
    duty = sum(default_duty if t.duty is None else t.duty for t in tenants)
    total = sum(memory)
    smallest, largest = (min(memory), max(memory)) if memory else (0, 0)
    return GpuLoad(
        gpu=gpu,
        usable_mib=usable,
        tenants=tuple(t.key for t in tenants),
        memory_total=total,
        memory_min=smallest,
        memory_max=largest,
        duty_sum=duty,
        parked_worst_mib=parked_worst_mib(total, smallest, largest, usable),
        default_duty=default_duty,
        open=gpu.healthy and len(tenants) < gpu.slots,
        binpack_key=(len(tenants) + 1) / gpu.slots,
        tenants_in=tuple(tenants),
    )


def node_state(
    name: str,
    gpus: Sequence[GpuRecord],
    budget_mib: int,
    tenants_by_gpu: Mapping[str, Sequence[PlacedPod]],
    limits: Limits,
    problem: str = "",
    reuse: Sequence[GpuLoad] = (),
) -> NodeState:
    """A node's state; tenants of GPUs the node does not list are ignored.

    `reuse`: GPU states made before with the same limits (the node's previous state); one for
    the same GPU with the same tenants is taken as it is instead of computed again."""
    known = {(s.gpu, s.tenants_in): s for s in reuse}
    on_each = [(g, tuple(tenants_by_gpu.get(g.uuid, ()))) for g in gpus]
    states = tuple(known.get(key) or gpu_load(*key, limits) for key in on_each)
    parked = sum(s.parked_worst_mib for s in states)
    usable = tuple(sorted((s.usable_mib for s in states), reverse=True))
    rows = tuple(_row(s) for s in states if s.open)
    distinct: dict[tuple[object, ...], Row] = {}
    for row in rows:
        same = distinct.get(row[:10])
        if same is None or row.neg_index > same.neg_index:
            distinct[row[:10]] = row
    return NodeState(
        name, states, budget_mib, parked, usable, rows, tuple(distinct.values()), problem
    )


def _row(s: GpuLoad) -> Row:
    return Row(
        s.usable_mib,
        s.duty_sum,
        s.default_duty,
        s.memory_total,
        s.memory_min,
        s.memory_max,
        s.parked_worst_mib,
        bool(s.tenants),
        s.binpack_key,
        len(s.tenants) / s.gpu.slots,
        -s.gpu.index,
        s.gpu.uuid,
    )


def describe_node(state: NodeState, assumed: set[str], pods: Mapping[str, str]) -> dict[str, Any]:
    """A node, its GPUs and their tenants (`pods`: their names by UID; `assumed`: those our
    binds counted before the watch showed them), for `/v1/inventory`."""
    return {
        "name": state.name,
        "hostMemoryBudgetMiB": state.budget_mib,
        "parkedWorstCaseMiB": state.parked_worst_mib,
        "problem": state.problem or None,
        "gpus": [
            {
                "uuid": g.gpu.uuid,
                "index": g.gpu.index,
                "model": g.gpu.model,
                "memoryMiB": g.gpu.memory_mib,
                "usableMiB": g.usable_mib,
                "healthy": g.gpu.healthy,
                "slots": g.gpu.slots,
                "freeSlots": g.gpu.slots - len(g.tenants),
                "summedDuty": round(g.duty_sum, 3),
                "tenantMemoryMiB": g.memory_total,
                "parkedWorstCaseMiB": g.parked_worst_mib,
                "tenants": [
                    {"uid": uid, "pod": pods.get(uid, ""), "assumed": uid in assumed}
                    for uid in g.tenants
                ],
            }
            for g in state.gpus
        ],
    }

"""The one fit rule: whether one more tenant fits one GPU, and what it costs the node. Pure.

A GPU takes a tenant when it is open (healthy, a free slot: `GpuLoad.open`), the tenant's
`gpu-memory` fits the GPU's memory capacity (a GPU with none, its memory all headroom, takes
no tenant) and the most per GPU its container memory limit can hold parked, and the GPU's
summed `gpu-duty` stays within the cap. A node takes the tenant's GPUs when their growth of its
parked-memory worst case stays within the room its host DRAM budget leaves (`room`).

The plain path (`placement`: both choosers) and the DRA path (`draplace.first_fit`) ask this
rule; they differ only in the ceilings they pass: usable memory and the extender's duty limit,
against the slice's published capacities.
"""

from __future__ import annotations

from typing import NamedTuple

from baton.contract.names import MIB
from baton.contract.podask import TenantRequest
from extender.snapshot import GpuLoad, Limits, NodeState, Row

EPSILON = 1e-9
"""Summed duty may pass its cap by this much (float sums of percentages)."""
NO_CAP = float("inf")


class Ask(NamedTuple):
    """A tenant's ask per GPU against one path's ceilings."""

    memory_mib: int | None
    """`gpu-memory`; None takes the GPU's whole capacity."""
    duty: float | None
    """`gpu-duty`; None takes the GPU's default (100 / slots)."""
    memory_cap: float
    """The most `gpu-memory` per GPU the container memory limit can hold parked."""
    duty_cap: float
    """The summed duty a GPU may reach."""


def plain_ask(request: TenantRequest, limits: Limits) -> Ask:
    """The ask on the plain path: capped by the memory limit and the extender's duty limit."""
    limit = request.memory_limit_bytes
    cap = NO_CAP if limit is None else limit // (MIB * request.gpus)
    return Ask(request.memory_mib, request.duty, cap, limits.max_duty)


Fit = tuple[float, int]
"""One open GPU taking the tenant: its summed duty after, and how much the node's parked worst
case grows (`snapshot.parked_worst_mib` with the tenant, less without). A plain tuple: the
choosers ask it in their hot loops."""


def row_fit(row: Row, ask: Ask) -> Fit | None:
    """The rule on one open GPU's row, its usable memory as the capacity; None: no fit."""
    usable, duty_sum, default_duty, total, smallest, largest, parked, has_tenants = row[:8]
    memory = usable if ask.memory_mib is None else ask.memory_mib
    if memory > usable or memory > ask.memory_cap or usable <= 0:  # headroom takes it all
        return None
    after = duty_sum + (default_duty if ask.duty is None else ask.duty)
    if after > ask.duty_cap + EPSILON:
        return None
    total += memory
    if total <= usable:
        return after, 0
    smallest = min(smallest, memory) if has_tenants else memory
    return after, total - max(smallest, usable - max(largest, memory)) - parked


def takes(ask: Ask, load: GpuLoad, capacity_mib: int) -> bool:
    """The rule on any GPU with another memory capacity (the DRA slice publishes the whole
    GPU's): open, and its memory and duty fit."""
    if not load.open:
        return False
    row = Row(capacity_mib, load.duty_sum, load.default_duty, 0, 0, 0, 0, False, 0.0, 0.0, 0, "")
    return row_fit(row, ask) is not None


def room(node: NodeState) -> int:
    """What the node's host DRAM budget leaves for more parked memory (negative: over it)."""
    return node.budget_mib - node.parked_worst_mib

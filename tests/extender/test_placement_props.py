"""Property tests of the placement core: placing tenant after tenant never oversubscribes."""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from baton.contract.podask import TenantRequest
from extender import placement
from extender.placement import (
    GpuRecord,
    Limits,
    PlacedPod,
    Policy,
    node_state,
    one_gpu_chooser,
    parked_worst_mib,
    place,
)

GIB = 1024

gpu_lists = st.lists(
    st.tuples(st.sampled_from([16, 24, 40, 80]), st.integers(1, 6), st.booleans()),
    min_size=1,
    max_size=6,
).map(
    lambda specs: [
        GpuRecord(f"GPU-{i}", i, "m", mem * GIB, slots, healthy=ok or i == 0)
        for i, (mem, slots, ok) in enumerate(specs)
    ]
)
requests = st.builds(
    TenantRequest,
    gpus=st.integers(1, 3),
    memory_mib=st.one_of(st.none(), st.integers(1, 90 * GIB)),
    duty=st.one_of(st.none(), st.integers(1, 100).map(float)),
    memory_limit_bytes=st.one_of(st.none(), st.integers(1, 200 * GIB).map(lambda m: m * 2**20)),
)
limits_st = st.builds(
    Limits,
    policy=st.sampled_from(list(Policy)),
    max_duty=st.sampled_from([50.0, 100.0, 150.0]),
    memory_headroom_mib=st.sampled_from([0, 512, 2048, 16 * GIB]),  # the last: all of a GPU
)


@settings(max_examples=400, deadline=None)
@given(gpu_lists, st.integers(0, 300 * GIB), st.lists(requests, max_size=25), limits_st)
def test_placing_never_exceeds_slots_memory_duty_or_budget(
    gpus: list[GpuRecord], budget: int, stream: list[TenantRequest], limits: Limits
) -> None:
    tenants: dict[str, list[PlacedPod]] = {}
    for i, request in enumerate(stream):
        _assert_fast_paths_agree(
            node_state("n", gpus, budget // 3, tenants, limits), request, limits
        )
        node = node_state("n", gpus, budget, tenants, limits)
        verdict = place(node, request, limits)
        filtered = place(node, request, limits, choose=False)
        assert filtered.fits is verdict.fits, (filtered, verdict)
        if request.gpus == 1:
            assert (one_gpu_chooser(request, limits)(node) is not None) is verdict.fits
            chosen = one_gpu_chooser(request, limits)(node)
            assert chosen == ((verdict.gpus[0], verdict.score) if verdict.fits else None)
            assert chosen == _reference_choice(node, request, limits)
        if not verdict.fits:
            assert verdict.reason
            continue
        assert len(set(verdict.gpus)) == request.gpus
        _assert_each_chosen_gpu_alone_accepts(node, tenants, verdict.gpus, request, limits)
        for uuid in verdict.gpus:
            tenants.setdefault(uuid, []).append(
                PlacedPod(f"t{i}", request.memory_mib, request.duty)
            )
        after = node_state("n", gpus, budget, tenants, limits)
        assert after.parked_worst_mib <= budget
        for state in after.gpus:
            assert len(state.tenants) <= state.gpu.slots
            assert state.duty_sum <= limits.max_duty + 1e-6
            assert state.memory_max <= state.usable_mib
            if state.tenants:
                assert state.gpu.healthy and state.usable_mib > 0


def _assert_fast_paths_agree(node, request, limits) -> None:
    """Also on nodes whose budget was lowered below what may already be parked."""
    verdict = place(node, request, limits)
    assert place(node, request, limits, choose=False).fits is verdict.fits
    if request.gpus == 1:
        assert (one_gpu_chooser(request, limits)(node) is not None) is verdict.fits
        assert one_gpu_chooser(request, limits)(node) == _reference_choice(node, request, limits)


def _reference_choice(node, request, limits):
    """The general path's choice (every GPU listed, then chosen), for the fast path to match."""
    if placement._never_fits(node, request, limits):
        return None
    candidates, _ = placement._candidates(node, request, limits, True)
    if not candidates:
        return None
    verdict = placement._choose(node, candidates, 1)
    return (verdict.gpus[0], verdict.score) if verdict.fits else None


def _assert_each_chosen_gpu_alone_accepts(node, tenants, chosen, request, limits) -> None:
    """Each chosen GPU passes the filter on its own, with the budget the others leave."""
    for uuid in chosen:
        state = next(s for s in node.gpus if s.gpu.uuid == uuid)
        others = node.parked_worst_mib - state.parked_worst_mib
        single = TenantRequest(1, request.memory_mib, request.duty, None)
        alone = node_state(
            "alone", [state.gpu], node.budget_mib - others, {uuid: tenants.get(uuid, [])}, limits
        )
        assert place(alone, single, limits).fits


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(1, 80), min_size=1, max_size=6),
    st.integers(40, 120),
    st.lists(st.integers(0, 5), max_size=60),
)
def test_parked_worst_case_bounds_lazy_lru_parking(
    sizes: list[int], usable: int, turns: list[int]
) -> None:
    """Simulate the agent: grant turns, parking least-recently-used residents only as needed."""
    sizes = [min(s, usable) for s in sizes]
    bound = parked_worst_mib(sum(sizes), min(sizes), max(sizes), usable)
    resident: OrderedDict[int, int] = OrderedDict()
    started: set[int] = set()
    for turn in turns:
        tenant = turn % len(sizes)
        started.add(tenant)
        if tenant in resident:
            resident.move_to_end(tenant)
        else:
            while sum(resident.values()) + sizes[tenant] > usable:
                resident.popitem(last=False)
            resident[tenant] = sizes[tenant]
        parked = sum(sizes[t] for t in started - set(resident))
        assert parked <= bound, (parked, dict(resident))


@settings(max_examples=200, deadline=None)
@given(gpu_lists, st.lists(st.tuples(requests, st.integers(0, 5)), max_size=12), limits_st)
def test_a_rebuilt_node_reuses_unchanged_gpus_and_equals_a_fresh_build(
    gpus: list[GpuRecord], stream: list[tuple[TenantRequest, int]], limits: Limits
) -> None:
    """Promised: a node rebuilt from its previous state (`reuse`) is the node built afresh,
    and a GPU whose tenants did not change keeps its very state object."""
    tenants: dict[str, list[PlacedPod]] = {}
    before = node_state("n", gpus, 100 * GIB, tenants, limits)
    for i, (request, which) in enumerate(stream):
        uuid = gpus[which % len(gpus)].uuid
        tenants.setdefault(uuid, []).append(PlacedPod(f"t{i}", request.memory_mib, request.duty))
        rebuilt = node_state("n", gpus, 100 * GIB, tenants, limits, reuse=before.gpus)
        assert rebuilt == node_state("n", gpus, 100 * GIB, tenants, limits)
        for old, new in zip(before.gpus, rebuilt.gpus, strict=True):
            if old.gpu.uuid != uuid:
                assert new is old
        before = rebuilt


@settings(max_examples=200, deadline=None)
@given(gpu_lists, st.lists(requests, min_size=1, max_size=6), limits_st)
def test_a_node_answers_a_request_shape_from_memory_as_it_would_afresh(
    gpus: list[GpuRecord], stream: list[TenantRequest], limits: Limits
) -> None:
    node = node_state("n", gpus, 100 * GIB, {}, limits)
    for request in stream:
        first = one_gpu_chooser(request, limits)(node)
        again = one_gpu_chooser(request, limits)(node)  # a second pod of the same shape
        fresh = one_gpu_chooser(request, limits)(node_state("n", gpus, 100 * GIB, {}, limits))
        assert first == again == fresh
    assert 0 < len(node.choices) <= len(stream)

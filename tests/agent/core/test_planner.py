"""The residency planner: tables of cases and properties over random nodes."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.planner import NodeView, Plan, Reason, Refusal, TenantView, plan_park, plan_turn
from baton.contract.names import MIB

G0, G1 = "GPU-0", "GPU-1"


def node(*tenants: TenantView, gpus=None, budget=1000 * MIB, headroom=0) -> NodeView:
    return NodeView(gpus or {G0: 100 * MIB}, {t.tenant_id: t for t in tenants}, headroom, budget)


def tv(name, mib, *, parked=False, last=0.0, limit=None, busy=False, gpu=G0) -> TenantView:
    return TenantView(
        name,
        {gpu: mib * MIB},
        {gpu: mib * MIB} if parked else {},
        last,
        None if limit is None else limit * MIB,
        busy,
    )


def test_everything_fits_moves_nothing():
    plan = plan_turn(node(tv("a", 30, last=1), tv("b", 30, last=2), tv("c", 30)), "c")
    assert plan == Plan()


def test_parks_least_recently_served_until_it_fits():
    snap = node(tv("a", 40, last=3), tv("b", 40, last=1), tv("c", 40, last=2), tv("d", 50))
    plan = plan_turn(snap, "d")
    assert isinstance(plan, Plan)
    assert [(s.direction, s.tenant_id) for s in plan.steps] == [("park", "b"), ("park", "c")]


def test_restores_the_incoming_tenant_after_making_room():
    snap = node(tv("a", 60, last=1), tv("b", 60, parked=True, last=0))
    plan = plan_turn(snap, "b")
    assert isinstance(plan, Plan)
    assert [(s.direction, s.tenant_id) for s in plan.steps] == [("park", "a"), ("restore", "b")]


def test_each_step_names_its_tenants_parking_method():
    """Tenants of different methods share a GPU: the plan says which method moves each."""
    a = dataclasses.replace(tv("a", 60, last=1), method="cuda")
    b = dataclasses.replace(tv("b", 60, parked=True, last=0), method="app")
    plan = plan_turn(node(a, b), "b")
    assert isinstance(plan, Plan)
    assert [(s.direction, s.tenant_id, s.method) for s in plan.steps] == [
        ("park", "a", "cuda"),
        ("restore", "b", "app"),
    ]
    park = plan_park(node(a, b), "a")
    assert isinstance(park, Plan) and [s.method for s in park.steps] == ["cuda"]


def test_headroom_counts_against_the_gpu():
    snap = node(tv("a", 45), tv("b", 45), headroom=20 * MIB)
    plan = plan_turn(snap, "b")
    assert isinstance(plan, Plan) and [s.tenant_id for s in plan.parks] == ["a"]


def test_refuses_a_park_over_the_host_budget_with_the_numbers():
    snap = node(tv("a", 60), tv("b", 60, parked=True), budget=100 * MIB)
    result = plan_turn(snap, "b")
    assert isinstance(result, Refusal) and result.reason == Reason.HOST_BUDGET
    assert "60 MiB" in result.message and "120 MiB" in result.message
    assert "100 MiB budget" in result.message


def test_never_parks_a_tenant_whose_cgroup_cannot_hold_it():
    snap = node(tv("a", 60, limit=50), tv("b", 60))
    result = plan_turn(snap, "b")
    assert isinstance(result, Refusal) and result.reason == Reason.CGROUP_LIMIT
    assert result.tenant_id == "a" and "memory limit 50 MiB" in result.message
    assert "60 MiB" in result.message


def test_a_tenant_that_fits_beside_an_unparkable_one_gets_its_turn():
    assert plan_turn(node(tv("a", 60, limit=50), tv("b", 40)), "b") == Plan()


def test_skips_unparkable_residents_for_parkable_ones():
    snap = node(tv("a", 50, limit=10, last=0), tv("b", 30, last=5), tv("c", 40))
    plan = plan_turn(snap, "c")
    assert isinstance(plan, Plan) and [s.tenant_id for s in plan.parks] == ["b"]


def test_never_parks_a_holder():
    result = plan_turn(node(tv("a", 60, busy=True), tv("b", 60)), "b")
    assert isinstance(result, Refusal) and result.reason == Reason.BUSY


def test_refuses_a_tenant_larger_than_its_gpu():
    result = plan_turn(node(tv("a", 90), headroom=20 * MIB), "a")
    assert isinstance(result, Refusal) and result.reason == Reason.TOO_LARGE
    assert "90 MiB" in result.message and "80 MiB" in result.message


def test_a_victim_is_parked_on_all_its_gpus():
    gpus = {G0: 100 * MIB, G1: 100 * MIB}
    a = TenantView("a", {G0: 60 * MIB, G1: 60 * MIB})
    plan = plan_turn(node(a, tv("b", 60, gpu=G1), gpus=gpus), "b")
    assert isinstance(plan, Plan)
    assert [(s.tenant_id, s.gpu) for s in plan.steps] == [("a", G0), ("a", G1)]


def test_plan_park_for_a_preempted_holder():
    plan = plan_park(node(tv("a", 60)), "a")
    assert isinstance(plan, Plan) and [s.tenant_id for s in plan.steps] == ["a"]
    refused = plan_park(node(tv("a", 60, limit=10)), "a")
    assert isinstance(refused, Refusal) and refused.reason == Reason.CGROUP_LIMIT
    refused = plan_park(node(tv("a", 60), budget=50 * MIB), "a")
    assert isinstance(refused, Refusal) and refused.reason == Reason.HOST_BUDGET


# Properties over random nodes.

GPUS = (G0, G1, "GPU-2")


@st.composite
def snapshots(draw, max_gpus=3):
    n_gpus = draw(st.integers(1, max_gpus))
    gpus = {g: draw(st.integers(10, 200)) for g in GPUS[:n_gpus]}
    n = draw(st.integers(1, 6))
    lasts = draw(st.lists(st.integers(0, 100), min_size=n, max_size=n, unique=True))
    tenants = {}
    for i in range(n):
        on = draw(st.lists(st.sampled_from(list(gpus)), min_size=1, unique=True))
        footprint = {g: draw(st.integers(1, 120)) for g in on}
        parked_on = draw(st.lists(st.sampled_from(on), unique=True))
        tenants[f"t{i}"] = TenantView(
            f"t{i}",
            footprint,
            {g: footprint[g] for g in parked_on},
            float(lasts[i]),
            draw(st.one_of(st.none(), st.integers(0, 300))),
            draw(st.booleans()) if i else False,
        )
    snap = NodeView(gpus, tenants, draw(st.integers(0, 10)), draw(st.integers(0, 600)))
    return snap, "t0"


def after(snap: NodeView, plan: Plan) -> dict[str, set[str]]:
    parked = {t: set(v.parked) for t, v in snap.tenants.items()}
    for s in plan.steps:
        (parked[s.tenant_id].add if s.direction == "park" else parked[s.tenant_id].discard)(s.gpu)
    return parked


@settings(max_examples=200, deadline=None)
@given(snapshots())
def test_plans_fit_gpu_and_host_memory_and_spare_who_must_stay(case):
    snap, me = case
    plan = plan_turn(snap, me)
    if isinstance(plan, Refusal):
        assert plan.message
        return
    parked = after(snap, plan)
    for gpu in snap.tenants[me].footprint:
        used = sum(
            t.footprint.get(gpu, 0) for t in snap.tenants.values() if gpu not in parked[t.tenant_id]
        )
        assert used <= snap.gpu_memory[gpu] - snap.headroom
    moved_out = sum(s.bytes for s in plan.parks)
    assert not plan.parks or snap.parked_bytes + moved_out <= snap.host_budget
    assert parked[me] == set()
    for s in plan.parks:
        victim = snap.tenants[s.tenant_id]
        assert s.tenant_id != me and not victim.busy and not victim.cgroup_blocks_park()


@settings(max_examples=150, deadline=None)
@given(snapshots())
def test_nobody_moves_when_all_fit(case):
    snap, me = case
    fits = all(
        sum(t.resident_on(g) for t in snap.tenants.values() if t.tenant_id != me) + need
        <= snap.gpu_memory[g] - snap.headroom
        for g, need in snap.tenants[me].footprint.items()
    )
    if fits and not snap.tenants[me].parked:
        assert plan_turn(snap, me) == Plan()


@settings(max_examples=150, deadline=None)
@given(snapshots(max_gpus=1))
def test_victims_are_the_shortest_least_recently_served_prefix(case):
    snap, me = case
    plan = plan_turn(snap, me)
    if isinstance(plan, Refusal):
        return
    gpu = next(iter(snap.gpu_memory))
    others = sorted(
        (t for t in snap.tenants.values() if t.tenant_id != me and t.resident_on(gpu)),
        key=lambda t: t.last_turn,
    )
    parkable = [t for t in others if not t.busy and not t.cgroup_blocks_park()]
    used = sum(t.resident_on(gpu) for t in others)
    need = snap.tenants[me].footprint.get(gpu, 0)
    expected = []
    for t in parkable:
        if used + need <= snap.gpu_memory[gpu] - snap.headroom:
            break
        expected.append(t.tenant_id)
        used -= t.resident_on(gpu)
    assert [s.tenant_id for s in plan.parks] == expected

"""Planning ahead of a turn: ready the next waiter beside the holders, never at their cost."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.planner import NodeView, Plan, Reason, Refusal, plan_ahead

from .test_planner import G0, after, node, snapshots, tv


def steps(plan: Plan | Refusal) -> list[tuple[str, str]]:
    assert isinstance(plan, Plan), plan
    return [(s.direction, s.tenant_id) for s in plan.steps]


def test_parks_an_idle_resident_and_restores_the_next_waiter():
    snap = node(
        tv("holder", 40, busy=True, last=3), tv("idle", 40, last=2), tv("next", 40, parked=True)
    )
    assert steps(plan_ahead(snap, "next")) == [("park", "idle"), ("restore", "next")]


def test_counts_a_holder_that_has_not_allocated_yet_in_full():
    holder = replace(tv("holder", 60, busy=True, last=3), absent=frozenset({G0}))
    snap = node(holder, tv("idle", 30, last=2), tv("next", 40, parked=True))
    assert steps(plan_ahead(snap, "next")) == [("park", "idle"), ("restore", "next")]


def test_gives_up_when_only_the_holder_stands_in_the_way():
    result = plan_ahead(node(tv("holder", 60, busy=True), tv("next", 60, parked=True)), "next")
    assert isinstance(result, Refusal) and result.reason == Reason.BUSY


def test_nothing_for_a_resident_waiter_that_fits_or_one_that_holds_already():
    snap = node(tv("holder", 40, busy=True), tv("next", 40))
    assert plan_ahead(snap, "next") == Plan()
    assert plan_ahead(node(tv("holder", 40, busy=True)), "holder") == Plan()
    assert plan_ahead(snap, "unknown") == Plan()


@st.composite
def with_holders(draw):
    """A random node where some tenants hold turns, some of them before allocating anything."""
    snap, me = draw(snapshots())
    tenants = dict(snap.tenants)
    for name, t in tenants.items():
        if t.busy and draw(st.booleans()):
            tenants[name] = replace(t, absent=frozenset(set(t.footprint) - set(t.parked)))
    return NodeView(snap.gpu_memory, tenants, snap.headroom, snap.host_budget), me


@settings(max_examples=300, deadline=None)
@given(with_holders())
def test_ahead_plans_never_park_holders_or_the_next_and_never_overfill(case):
    snap, me = case
    plan = plan_ahead(snap, me)
    if isinstance(plan, Refusal):
        assert plan.message
        return
    for s in plan.parks:
        assert s.tenant_id != me and not snap.tenants[s.tenant_id].busy
    if not plan.steps:
        return
    parked = after(snap, plan)
    assert parked[me] == set()
    for gpu in snap.tenants[me].footprint:
        used = sum(  # holders at their whole footprint: they may allocate during their turn
            t.footprint.get(gpu, 0) if t.busy or t.tenant_id == me else t.resident_on(gpu)
            for t in snap.tenants.values()
            if gpu not in parked[t.tenant_id]
        )
        assert used <= snap.gpu_memory[gpu] - snap.headroom
    moved_out = sum(s.bytes for s in plan.parks)
    assert not plan.parks or snap.parked_bytes + moved_out <= snap.host_budget


@settings(max_examples=100, deadline=None)
@given(snapshots(), st.sampled_from([True, False]))
def test_budget_is_never_exceeded_even_when_tight(case, tight):
    snap, me = case
    if tight:
        snap = replace(snap, host_budget=snap.parked_bytes)
    plan = plan_ahead(snap, me)
    if isinstance(plan, Plan) and plan.parks:
        assert snap.parked_bytes + sum(s.bytes for s in plan.parks) <= snap.host_budget

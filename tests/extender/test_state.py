"""The cluster state: assumptions from binds until the watch confirms them, with a fake clock."""

from __future__ import annotations

from baton.contract import names
from extender.inventory import Assignment
from extender.placement import Limits, PlacedPod
from extender.state import ClusterState
from tests.extender.builders import node, pod


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def tenants(state: ClusterState, name: str = "n1") -> list[str]:
    found = state.node(name)
    assert found is not None
    return [t for g in found.gpus for t in g.tenants]


def assume(state: ClusterState, uid: str, gpu: str = "GPU-n1-0") -> None:
    state.assume(Assignment(uid, f"default/{uid}", "n1", (gpu,), PlacedPod(uid, 1000, 10)))


def setup() -> tuple[ClusterState, Clock]:
    clock = Clock()
    state = ClusterState(Limits(), clock, unsure_ttl_s=60)
    state.replace_nodes([node("n1", gpus=1)])
    state.replace_pods([])
    return state, clock


def test_an_assumption_counts_until_the_watch_shows_the_bound_pod() -> None:
    state, _ = setup()
    assume(state, "u1")
    assert tenants(state) == ["u1"]
    annotated_only = pod("p", uid="u1", assigned=["GPU-n1-0"])
    state.upsert_pod(annotated_only)
    assert state.assumed() != {} and tenants(state) == ["u1"]
    state.upsert_pod(pod("p", uid="u1", node_name="n1", assigned=["GPU-n1-0"]))
    assert state.assumed() == {}
    assert tenants(state) == ["u1"]


def test_an_answered_binds_assumption_outlives_any_watch_lag_and_goes_with_its_pod() -> None:
    """kubernetes#106361: expiring an assumption while the watch lags frees a taken slot."""
    state, clock = setup()
    assume(state, "u1")
    assume(state, "u2")
    state.delete_pod(pod("p", uid="u2"))
    assert tenants(state) == ["u1"]
    clock.now += 3600
    state.upsert_pod(pod("other", uid="u3"))
    assert tenants(state) == ["u1"]
    state.upsert_pod(pod("p", uid="u1", node_name="n1", assigned=["GPU-n1-0"]))
    assert state.assumed() == {} and tenants(state) == ["u1"]


def test_an_unanswered_binds_assumption_expires() -> None:
    state, clock = setup()
    assume(state, "u1")
    state.keep_unsure("u1")
    clock.now += 59
    state.upsert_pod(pod("other", uid="u3"))
    assert tenants(state) == ["u1"]
    clock.now += 2
    state.upsert_pod(pod("other", uid="u3"))
    assert tenants(state) == []


def test_a_pod_shown_bound_without_gpus_settles_its_assumptions() -> None:
    """Bound by someone else, or done: nothing of ours holds the slot any more."""
    state, _ = setup()
    assume(state, "u1")
    state.keep_unsure("u1")
    assume(state, "u1")
    assert tenants(state) == ["u1", "u1"]
    state.upsert_pod(pod("p", uid="u1", node_name="n1"))
    assert state.assumed() == {} and tenants(state) == []


def test_a_relist_settles_what_it_shows_bound_and_keeps_the_rest() -> None:
    """Shown bound: settled. Shown pending: the list may predate the bind. Not shown: deleted
    before the list or created after it began, so counted until the TTL, from the relist, ends
    with the watch not showing it."""
    state, clock = setup()
    for uid in ("u1", "u2", "u3", "u4"):
        assume(state, uid)
    clock.now += 100
    state.replace_pods(
        [
            pod("p1", uid="u1", node_name="n1", assigned=["GPU-n1-0"]),
            pod("p2", uid="u2", node_name="n1"),
            pod("p3", uid="u3"),
        ]
    )
    assert set(state.assumed()) == {"u3", "u4"}
    assert sorted(tenants(state)) == ["u1", "u3", "u4"]
    clock.now += 59
    state.upsert_pod(pod("other", uid="u5"))
    assert sorted(tenants(state)) == ["u1", "u3", "u4"]
    clock.now += 2
    state.upsert_pod(pod("other", uid="u5"))
    assert sorted(tenants(state)) == ["u1", "u3"]


def test_a_pod_the_relist_missed_that_the_watch_then_shows_keeps_its_assumption() -> None:
    """Created after the list began: the watch from the list shows it, and its answered bind
    holds the slot however late the watch then shows it bound."""
    state, clock = setup()
    assume(state, "u1")
    state.replace_pods([])
    state.upsert_pod(pod("p1", uid="u1"))
    clock.now += 3600
    state.upsert_pod(pod("other", uid="u5"))
    assert tenants(state) == ["u1"] and set(state.assumed()) == {"u1"}


def test_a_refused_bind_of_a_pod_the_relist_missed_frees_its_slot_at_once() -> None:
    state, _ = setup()
    assume(state, "u1")
    state.replace_pods([])
    state.forget("u1")
    assert tenants(state) == []


def test_a_relist_missing_a_retried_pod_keeps_its_unanswered_bind() -> None:
    """The first bind went unanswered (maybe bound, on GPU 1); the retry (GPU 0) is in flight
    when a relist misses the pod: both stay counted."""
    state, _ = setup()
    state.replace_nodes([node("n1", gpus=2)])
    assume(state, "u1", gpu="GPU-n1-1")
    state.keep_unsure("u1")
    assume(state, "u1", gpu="GPU-n1-0")
    state.replace_pods([])
    found = state.node("n1")
    assert found is not None and [g.tenants for g in found.gpus] == [("u1",), ("u1",)]
    state.forget("u1")  # the retry is refused; the unanswered bind may still hold GPU 1
    found = state.node("n1")
    assert found is not None and [g.tenants for g in found.gpus] == [(), ("u1",)]


def test_forget_frees_the_slot_and_node_without_leaves_out_victims() -> None:
    state, _ = setup()
    state.replace_pods([pod("p1", uid="u1", node_name="n1", assigned=["GPU-n1-0"])])
    assume(state, "u2")
    state.forget("u2")
    assert tenants(state) == ["u1"]
    without = state.node_without("n1", {"u1"})
    assert without is not None and [t for g in without.gpus for t in g.tenants] == []
    assert tenants(state) == ["u1"]


def test_the_watch_confirming_an_assumption_keeps_the_node_state() -> None:
    state, _ = setup()
    state.assume(Assignment("u1", "default/p", "n1", ("GPU-n1-0",), PlacedPod("u1", None, None)))
    assumed = state.node("n1")
    state.upsert_pod(pod("p", uid="u1", node_name="n1", assigned=["GPU-n1-0"]))
    assert state.assumed() == {}
    assert state.node("n1") is assumed
    running = pod("p", uid="u1", node_name="n1", assigned=["GPU-n1-0"])
    running["status"]["phase"] = "Running"
    state.upsert_pod(running)
    assert state.node("n1") is assumed


def test_the_watch_showing_another_assignment_than_assumed_rebuilds_the_node() -> None:
    state, _ = setup()
    state.replace_nodes([node("n1", gpus=2)])
    state.assume(Assignment("u1", "default/p", "n1", ("GPU-n1-0",), PlacedPod("u1", None, None)))
    assumed = state.node("n1")
    state.upsert_pod(pod("p", uid="u1", node_name="n1", assigned=["GPU-n1-1"]))
    rebuilt = state.node("n1")
    assert rebuilt is not assumed and rebuilt is not None
    assert [list(g.tenants) for g in rebuilt.gpus] == [[], ["u1"]]


def test_nodes_that_come_and_go_leave_nothing_behind() -> None:
    """An autoscaler adds and deletes nodes all day, each name seen once: once a node and its
    pods are gone, the state keeps nothing under its name (plain and DRA pods alike)."""
    state, _ = setup()
    state.dra = True
    for i in range(3):
        name = f"spot-{i}"
        state.upsert_node(node(name, gpus=1))
        plain = pod("p", uid=f"u{i}", node_name=name, assigned=[f"GPU-{name}-0"])
        claimed = pod("c", gpus=None, node_name=name, uid=f"c{i}")
        state.upsert_pod(plain)
        state.upsert_pod(claimed)
        state.upsert_claim(dra_claim(f"c{i}-gpu", name, f"c{i}"))
        assert tenants(state, name) == [f"u{i}", f"c{i}"]
        state.delete_pod(plain)
        state.delete_pod(claimed)
        state.delete_claim(dra_claim(f"c{i}-gpu", name, f"c{i}"))
        state.delete_node(node(name, gpus=1))
    assert state.node_names() == ["n1"]
    assert dict(state._by_node) == {}
    assert dict(state._claims._by_node) == {}


def dra_claim(name: str, node_name: str, uid: str) -> dict[str, object]:
    result = {"request": "gpu", "driver": names.DRA_DRIVER, "pool": node_name, "device": "gpu-0"}
    return {
        "metadata": {"namespace": "default", "name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {}}]}},
        "status": {
            "allocation": {"devices": {"results": [result]}},
            "reservedFor": [{"resource": "pods", "name": "c", "uid": uid}],
        },
    }

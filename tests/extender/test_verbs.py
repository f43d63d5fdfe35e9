"""Filter and prioritize without HTTP: prioritize answered from the scores filter kept."""

from __future__ import annotations

import copy
import time
from typing import Any

from baton.contract.names import ANNOTATION_GPUS
from extender.inventory import Assignment
from extender.placement import Limits, PlacedPod
from extender.state import ClusterState
from extender.verbs import FilterScores, filter_nodes, prioritize_nodes
from extender.wire import ExtenderArgs
from tests.extender.builders import node, pod

NAMES = ["node-a", "node-b", "node-c"]


def cluster() -> ClusterState:
    state = ClusterState(Limits(), time.monotonic)
    state.replace_nodes([node(name, gpus=2) for name in NAMES])
    state.replace_pods([])
    return state


def args(p: dict[str, Any], names: list[str] = NAMES) -> ExtenderArgs:
    return ExtenderArgs(p, list(names), None)


def occupy(state: ClusterState, name: str, uid: str = "other") -> None:
    """Another pod's bind takes GPU 0 of the node (an assumption, as a bind makes)."""
    tenant = PlacedPod(uid, 40000, 50)
    state.assume(Assignment(uid, f"default/{uid}", name, (f"GPU-{name}-0",), tenant))


def test_prioritize_after_filter_gives_the_scores_it_would_compute_itself() -> None:
    state, kept = cluster(), FilterScores()
    occupy(state, "node-b")
    p = pod(memory=8192, duty=20)
    passed, failed, _ = filter_nodes(state, args(p), kept)
    assert passed == NAMES and not failed
    assert prioritize_nodes(state, args(p), kept) == prioritize_nodes(state, args(p))
    assert kept.take("x") == {}


def test_prioritize_scores_the_pod_on_the_state_filter_judged_it_on() -> None:
    """Promised: a bind finishing between a pod's filter and its prioritize (kube-scheduler
    scores a pod on the snapshot it filtered it on) does not change the pod's scores."""
    state, kept = cluster(), FilterScores()
    p = pod(memory=8192, duty=20)
    filter_nodes(state, args(p), kept)
    before = dict(prioritize_nodes(state, args(p)))
    occupy(state, "node-a")
    fresh = dict(prioritize_nodes(state, args(p)))
    assert fresh["node-a"] != before["node-a"]  # the state did change the score
    assert dict(prioritize_nodes(state, args(p), kept)) == before


def test_nodes_filter_did_not_score_and_changed_pods_are_scored_afresh() -> None:
    state, kept = cluster(), FilterScores()
    p = pod(memory=8192, duty=20)
    filter_nodes(state, args(p, ["node-a"]), kept)
    occupy(state, "node-a")
    occupy(state, "node-b")
    scores = dict(prioritize_nodes(state, args(p), kept))
    assert scores["node-b"] == dict(prioritize_nodes(state, args(p)))["node-b"]
    filter_nodes(state, args(p), kept)
    changed = {**p, "metadata": {**p["metadata"], "resourceVersion": "2"}}
    occupy(state, "node-c", uid="third")
    assert prioritize_nodes(state, args(changed), kept) == prioritize_nodes(state, args(changed))


def test_kept_scores_are_used_once_and_only_for_the_last_pods() -> None:
    kept = FilterScores(pods=2)
    for name in ("a", "b", "c"):
        kept.keep(name, {"node-a": 1})
    assert kept.take("a") == {}  # the oldest went
    assert kept.take("c") == {"node-a": 1}
    assert kept.take("c") == {}


def test_multi_gpu_and_unusable_requests_keep_no_scores() -> None:
    state, kept = cluster(), FilterScores()
    passed, _, _ = filter_nodes(state, args(pod(gpus=2, memory=8192)), kept)
    assert passed == NAMES
    _, _, unresolvable = filter_nodes(state, args(pod(memory="lots")), kept)
    assert set(unresolvable) == set(NAMES)
    assert len(kept) == 0  # nothing kept for either


def test_a_node_without_the_gpu_annotation_is_refused_naming_it() -> None:
    """Such a node may well advertise `baton.dev/gpu` (a device plugin that cannot write its
    node's annotations): "advertises no Baton GPUs" pointed the user at the wrong thing."""
    bare = node("node-a", gpus=2)
    del bare["metadata"]["annotations"][ANNOTATION_GPUS]
    state = ClusterState(Limits(), time.monotonic)
    state.replace_nodes([bare, node("node-b", gpus=[])])
    state.replace_pods([])
    _, failed, _ = filter_nodes(state, args(pod(), ["node-a", "node-b"]))
    assert failed == {
        "node-a": "node has no baton.dev/gpus annotation: Baton's device plugin or DRA driver on"
        " the node writes it (is one running there?)",
        "node-b": "node advertises no Baton GPUs",
    }


def test_a_pod_level_memory_limit_too_small_to_hold_the_parked_memory_is_unresolvable() -> None:
    """The agent parks only what the tightest memory cgroup on the tenant's path can hold, and
    a pod-level limit (`spec.resources`, PodLevelResources) is the pod cgroup's: a pod whose
    containers name no memory limit under a 1 GiB pod limit was placed as unlimited, and the
    agent then refused to park its 40 GiB."""
    state = cluster()
    p = pod(uid="u-pod-limit", memory=40960, memory_limit=None)
    p["spec"]["resources"] = {"limits": {"cpu": "8", "memory": "1Gi"}}
    passed, failed, unresolvable = filter_nodes(state, args(p))
    assert passed == [] and failed == {}
    assert set(unresolvable) == set(NAMES)
    assert "memory limit 1 GiB cannot hold the 40 GiB" in unresolvable["node-a"]
    resized = copy.deepcopy(p)  # as kube-scheduler sends it again: read afresh
    resized["spec"]["resources"]["limits"]["memory"] = "64Gi"
    assert filter_nodes(state, args(resized))[0] == NAMES
    bad = copy.deepcopy(p)
    bad["spec"]["resources"]["limits"]["memory"] = "lots"
    unreadable = filter_nodes(state, args(bad))[2]["node-a"]
    assert unreadable == "pod memory limit 'lots' is not a quantity"

"""The extender with `--dra`: pods counted from their claims' allocations, claim pods filtered
and scored on the GPU the scheduler would allocate, with readable reasons."""

from __future__ import annotations

import time
from typing import Any

from baton.contract import names
from baton.contract.draclaim import ClaimRef
from baton.contract.reflector import WatchEvent
from extender.cache import DRA_KINDS, KINDS, ClusterCache, _KindStore
from extender.placement import Limits, Policy
from extender.state import ClusterState
from extender.verbs import FilterScores, filter_nodes, prioritize_nodes
from extender.wire import ExtenderArgs
from tests.extender.builders import node, pod

GIB = 1 << 30


def claim(
    name: str,
    memory: str | None = "30Gi",
    duty: str | None = "30",
    node_name: str | None = None,
    device: str = "gpu-0",
    pod_uid: str | None = None,
) -> dict[str, Any]:
    """A ResourceClaim of Baton's class; allocated on `node_name` and reserved for `pod_uid`."""
    wanted = {k: v for k, v in (("memory", memory), ("duty", duty)) if v is not None}
    exactly: dict[str, Any] = {"deviceClassName": names.DRA_DEVICE_CLASS}
    if wanted:
        exactly["capacity"] = {"requests": wanted}
    status: dict[str, Any] = {}
    if node_name:
        result = {
            "request": "gpu",
            "driver": names.DRA_DRIVER,
            "pool": node_name,
            "device": device,
            "consumedCapacity": {"slots": "1", **wanted},
        }
        status["allocation"] = {"devices": {"results": [result]}}
        status["reservedFor"] = [{"resource": "pods", "name": "p", "uid": pod_uid}]
    return {
        "metadata": {"namespace": "default", "name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        "status": status,
    }


def claim_pod(name: str, claim_name: str, node_name: str | None = None) -> dict[str, Any]:
    """A pod whose container uses the claim made from its template."""
    p = pod(name, gpus=None, node_name=node_name, uid=f"uid-{name}")
    p["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "baton-30g"}]
    p["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    p["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": claim_name}]
    return p


def dra_state(policy: Policy = Policy.BINPACK) -> ClusterState:
    state = ClusterState(Limits(policy), time.monotonic, dra=True)
    state.replace_nodes([node("n1", gpus=2, budget_mib=70 * 1024), node("n2", gpus=2)])
    return state


def test_a_pod_counts_on_the_gpu_its_claim_names_while_it_lives() -> None:
    state = dra_state()
    running = claim_pod("a", "a-gpu", node_name="n1")
    # The claim may be seen before its pod: nothing counts until the pod is live.
    state.upsert_claim(claim("a-gpu", node_name="n1", device="gpu-1", pod_uid="uid-a"))
    assert state.node("n1").gpus[1].tenants == ()  # type: ignore[union-attr]
    state.replace_pods([running])
    gpu = state.node("n1").gpus[1]  # type: ignore[union-attr]
    assert (gpu.tenants, gpu.memory_total, gpu.duty_sum) == (("uid-a",), 30 * 1024, 30.0)
    assert state.node("n1").gpus[0].tenants == ()  # type: ignore[union-attr]
    assert [t["pod"] for t in state.inventory()[0]["gpus"][1]["tenants"]] == ["default/a"]
    state.delete_pod(running)
    assert state.node("n1").gpus[1].tenants == ()  # type: ignore[union-attr]
    state.upsert_pod(running)
    assert state.node("n1").gpus[1].tenants == ("uid-a",)  # type: ignore[union-attr]
    state.upsert_claim(claim("a-gpu"))  # deallocated
    assert state.node("n1").gpus[1].tenants == ()  # type: ignore[union-attr]


def test_a_generated_claim_without_capacity_counts_the_class_defaults() -> None:
    state = dra_state()
    state.replace_pods([pod("b", node_name="n2", uid="uid-b")])
    state.replace_claims([claim("b-gpu", None, None, node_name="n2", pod_uid="uid-b")])
    gpu = state.node("n2").gpus[0]  # type: ignore[union-attr]
    assert (gpu.tenants, gpu.memory_total, gpu.duty_sum) == (("uid-b",), 80 * 1024, 25.0)
    state.delete_claim(claim("b-gpu"))
    assert state.node("n2").gpus[0].tenants == ()  # type: ignore[union-attr]


def _filled(state: ClusterState) -> ClusterState:
    """Two 60 GiB tenants on n1's gpu-0 (parked worst case 60 GiB of its 70 GiB budget)."""
    tenants = [claim_pod(n, f"{n}-gpu", node_name="n1") for n in ("x", "y")]
    state.replace_pods(tenants)
    state.replace_claims(
        [claim(f"{n}-gpu", "60Gi", "30", "n1", "gpu-0", f"uid-{n}") for n in ("x", "y")]
    )
    return state


def test_filter_refuses_the_node_whose_host_budget_the_first_fit_gpu_would_pass() -> None:
    state = _filled(dra_state())
    pending = claim_pod("new", "new-gpu")
    state.upsert_claim(claim("new-gpu"))
    passed, failed, unresolvable = filter_nodes(state, ExtenderArgs(pending, ["n1", "n2"], None))
    assert passed == ["n2"]
    assert failed == {
        "n1": "the scheduler would allocate gpu-0 (GPU-n1-0): parked worst case would be"
        " 120 GiB > host budget 70 GiB (host DRAM)"
    }
    assert unresolvable == {}


def test_filter_waits_for_a_claim_it_has_not_seen() -> None:
    state = dra_state()
    args = ExtenderArgs(claim_pod("new", "new-gpu"), ["n1"], None)
    reason = "claim default/new-gpu is not in the extender's cache yet"
    assert filter_nodes(state, args) == ([], {"n1": reason}, {})
    unmade = claim_pod("new", "new-gpu")
    del unmade["status"]["resourceClaimStatuses"]
    assert filter_nodes(state, ExtenderArgs(unmade, ["n1"], None))[1] == {
        "n1": "the claim for 'gpu' is not made yet"
    }
    assert prioritize_nodes(state, args) == [("n1", 0)]


def test_a_plain_gpu_pod_is_judged_with_the_class_defaults_on_the_first_fit_gpu() -> None:
    state = _filled(dra_state())
    args = ExtenderArgs(pod("plain", uid="uid-plain"), ["n1", "n2"], None)
    passed, failed, _ = filter_nodes(state, args)
    assert passed == ["n2"]
    assert failed["n1"].startswith("the scheduler would allocate gpu-0 (GPU-n1-0): parked")


def test_prioritize_scores_duty_complement_on_the_first_fit_gpu() -> None:
    state = dra_state(Policy.COMPLEMENT)
    state.replace_pods([claim_pod("x", "x-gpu", node_name="n2")])
    state.replace_claims([claim("x-gpu", "10Gi", "60", "n2", "gpu-0", "uid-x")])
    state.upsert_claim(claim("new-gpu", "10Gi", "40"))
    args = ExtenderArgs(claim_pod("new", "new-gpu"), ["n1", "n2"], None)
    assert prioritize_nodes(state, args) == [("n1", 4), ("n2", 10)]


def test_prioritize_scores_a_claim_pod_on_the_state_filter_judged_it_on() -> None:
    """As on the plain path: a bind landing between a pod's filter and its prioritize does not
    change the scores, and prioritize reuses filter's instead of judging again."""
    state, kept = dra_state(Policy.COMPLEMENT), FilterScores()
    state.upsert_claim(claim("new-gpu", "10Gi", "40"))
    args = ExtenderArgs(claim_pod("new", "new-gpu"), ["n1", "n2"], None)
    assert filter_nodes(state, args, kept)[0] == ["n1", "n2"]
    state.replace_pods([claim_pod("x", "x-gpu", node_name="n2")])
    state.replace_claims([claim("x-gpu", "10Gi", "60", "n2", "gpu-0", "uid-x")])
    state.upsert_claim(claim("new-gpu", "10Gi", "40"))
    fresh = prioritize_nodes(state, args)
    assert fresh == [("n1", 4), ("n2", 10)]  # the bind did change n2's score
    assert prioritize_nodes(state, args, kept) == [("n1", 4), ("n2", 4)]
    assert len(kept) == 0  # used once: the next prioritize of this pod judges afresh


def test_each_node_state_is_judged_once_per_request_shape(monkeypatch: Any) -> None:
    from extender import draplace

    judged: list[str] = []
    real = draplace.place_claim

    def counted(node: Any, request: Any, limits: Any, shares: Any = ()) -> Any:
        judged.append(node.name)
        return real(node, request, limits, shares)

    # claim_judge looks `place_claim` up when it answers, so the count sees every placement
    monkeypatch.setattr(draplace, "place_claim", counted)
    state = _filled(dra_state())
    for name in ("p1", "p2"):  # two pending pods of one shape
        state.upsert_claim(claim(f"{name}-gpu"))
        args = ExtenderArgs(claim_pod(name, f"{name}-gpu"), ["n1", "n2"], None)
        assert filter_nodes(state, args)[0] == ["n2"]
        assert prioritize_nodes(state, args)[0] == ("n1", 0)
    assert judged == ["n1", "n2"]  # filter's answers served prioritize and the second pod
    # p2 bound on n2: that node is judged afresh, n1 (unchanged) is not.
    state.upsert_pod(claim_pod("p2", "p2-gpu", node_name="n2"))
    state.upsert_claim(claim("p2-gpu", node_name="n2", pod_uid="uid-p2"))
    state.upsert_claim(claim("p3-gpu", "60Gi"))
    args = ExtenderArgs(claim_pod("p3", "p3-gpu"), ["n1", "n2"], None)
    filter_nodes(state, args)
    state.upsert_claim(claim("p4-gpu"))
    filter_nodes(state, ExtenderArgs(claim_pod("p4", "p4-gpu"), ["n1", "n2"], None))
    assert judged == ["n1", "n2", "n1", "n2", "n2"]  # p3's new shape, then p4 on changed n2


def test_a_pod_without_baton_asks_passes_everywhere() -> None:
    state = dra_state()
    other = pod("cpu", gpus=None)
    assert filter_nodes(state, ExtenderArgs(other, ["n1", "n2"], None)) == (["n1", "n2"], {}, {})


def test_the_claim_watch_feeds_the_state_and_counts_for_sync() -> None:
    state = dra_state()
    cache = ClusterCache(state, DRA_KINDS)
    cache.mark_synced("nodes")
    cache.mark_synced("pods")
    assert not cache.synced()
    store = _KindStore(cache, "resourceclaims")
    store.replace([claim("c-gpu")], "1")
    assert cache.synced()
    assert state.claim_asks(_ref("c-gpu")) is not None
    store.apply(WatchEvent("DELETED", claim("c-gpu")))
    assert state.claim_asks(_ref("c-gpu")) is None
    assert ClusterCache(state).kinds == KINDS


def _ref(name: str) -> ClaimRef:
    return ClaimRef("default", name)


def test_without_dra_claims_count_for_nothing() -> None:
    """The device-plugin path's extender keeps no claim book: a claim's pod is not counted."""
    state = ClusterState(Limits(), time.monotonic)
    state.replace_nodes([node("n1", gpus=2)])
    state.replace_pods([claim_pod("a", "a-gpu", node_name="n1")])
    state.upsert_claim(claim("a-gpu", node_name="n1", pod_uid="uid-a"))
    assert [g.tenants for g in state.node("n1").gpus] == [(), ()]  # type: ignore[union-attr]


def test_a_pod_with_two_claims_may_get_one_gpu_for_both_as_the_scheduler_gives_it() -> None:
    """Baton's devices allow several allocations: the scheduler gives a pod's second claim the
    GPU its first took when that still fits, so a one-GPU node serves a two-claim pod."""
    state = ClusterState(Limits(), time.monotonic, dra=True)
    state.replace_nodes([node("one", gpus=1), node("two", gpus=2)])
    pending = claim_pod("pair", "pair-a")
    pending["spec"]["resourceClaims"] = [
        {"name": "a", "resourceClaimName": "pair-a"},
        {"name": "b", "resourceClaimName": "pair-b"},
    ]
    state.replace_claims([claim("pair-a"), claim("pair-b")])
    args = ExtenderArgs(pending, ["one", "two"], None)
    assert filter_nodes(state, args) == (["one", "two"], {}, {})
    # Once gpu-0's duty cannot take the second share, it goes to the next GPU, as DRA's does.
    state.replace_claims([claim("pair-a", duty="60"), claim("pair-b", duty="60")])
    passed, failed, _ = filter_nodes(state, args)
    assert passed == ["two"]
    assert failed["one"] == "no 2 Baton GPUs of this node have the capacity its claims ask"


def test_a_pod_whose_claim_is_reserved_for_it_is_not_counted_twice() -> None:
    """kube-scheduler retries a pod whose bind failed while its claim is still allocated and
    reserved for it (Unreserve's patch not yet seen, or it failed): the claim's share is the
    pod's own, not a tenant beside it, and the scheduler allocates nothing more for it."""
    state = ClusterState(Limits(), time.monotonic, dra=True)
    state.replace_nodes([node("one", gpus=1)])
    retried = claim_pod("r", "r-gpu")  # still Pending: not bound
    state.replace_pods([retried])
    state.replace_claims([claim("r-gpu", "60Gi", "60", "one", "gpu-0", "uid-r")])
    assert state.node("one").gpus[0].tenants == ("uid-r",)  # type: ignore[union-attr]
    args = ExtenderArgs(retried, ["one"], None)
    assert filter_nodes(state, args) == (["one"], {}, {})
    assert prioritize_nodes(state, args)[0][1] > 0
    # Another pending pod of the same shape is judged against r's share as before.
    state.upsert_claim(claim("o-gpu", "60Gi", "60"))
    other = ExtenderArgs(claim_pod("o", "o-gpu"), ["one"], None)
    assert filter_nodes(state, other)[0] == []


def test_a_pod_with_two_shares_of_one_gpu_takes_both_of_the_schedulers_capacity() -> None:
    """The scheduler counts each share of a GPU (its duty and a slot): a pod holding two 40%
    claims on gpu-0 leaves 20% there, so the next 30% claim goes to gpu-1. The extender counted
    the pod once (40%), judged gpu-0 and let a pod through whose share on gpu-1 takes the
    node's parked worst case past its host DRAM budget."""
    state = dra_state()  # n1: 2 GPUs, host budget 70 GiB
    pair = claim_pod("pair", "pair-a", node_name="n1")
    pair["spec"]["resourceClaims"] = [
        {"name": "a", "resourceClaimName": "pair-a"},
        {"name": "b", "resourceClaimName": "pair-b"},
    ]
    tenants = [claim_pod(n, f"{n}-gpu", node_name="n1") for n in ("x", "y")]
    state.replace_pods([pair, *tenants])
    state.replace_claims(
        [claim(f"pair-{c}", "10Gi", "40", "n1", "gpu-0", "uid-pair") for c in "ab"]
        + [claim(f"{n}-gpu", "60Gi", "10", "n1", "gpu-1", f"uid-{n}") for n in ("x", "y")]
    )
    state.upsert_claim(claim("new-gpu", "60Gi", "30"))
    passed, failed, _ = filter_nodes(state, ExtenderArgs(claim_pod("new", "new-gpu"), ["n1"], None))
    assert passed == []
    assert failed["n1"].startswith("the scheduler would allocate gpu-1 (GPU-n1-1): parked")

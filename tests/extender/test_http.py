"""The HTTP verbs, driven with request bodies shaped exactly like kube-scheduler's."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from extender.app import create_app
from extender.cache import ClusterCache
from extender.metrics import Metrics
from extender.placement import Limits
from extender.server import ServerThread
from extender.state import ClusterState
from tests.extender.builders import node, pod

NODES = [
    node("node-a", gpus=2),
    node("node-b", gpus=1, slots=1),
    node("node-c", gpus=2, memory=16384),
]
BUSY = [pod("busy", memory=1000, node_name="node-b", assigned=["GPU-node-b-0"])]


@pytest.fixture(scope="module")
def cache() -> ClusterCache:
    return ClusterCache.filled(ClusterState(Limits(), time.monotonic), NODES, BUSY)


@pytest.fixture(scope="module")
def client(cache: ClusterCache) -> Iterator[httpx.Client]:
    with (
        ServerThread(create_app(cache, None, Metrics())) as server,
        httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=10) as c,
    ):
        yield c


def names_only(p: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """ExtenderArgs as kube-scheduler sends it with nodeCacheCapable: true."""
    return {"Pod": p, "Nodes": None, "NodeNames": names}


def full_list(p: dict[str, Any], nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """ExtenderArgs as kube-scheduler sends it with nodeCacheCapable: false."""
    return {"Pod": p, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}


def post(client: httpx.Client, verb: str, body: Any) -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(f"/{verb}", content=data, headers={"Content-Type": "application/json"})


def test_filter_names_only(client: httpx.Client) -> None:
    names = ["node-a", "node-b", "node-c", "ghost"]
    answer = post(client, "filter", names_only(pod(memory=20000, duty=50), names))
    assert answer.status_code == 200
    body = answer.json()
    assert list(body) == [
        "Nodes",
        "NodeNames",
        "FailedNodes",
        "FailedAndUnresolvableNodes",
        "Error",
    ]
    assert body["Nodes"] is None
    assert body["NodeNames"] == ["node-a"]
    assert body["FailedNodes"] == {
        "node-b": "no GPU can take it: GPU-node-b-0 has no free slot (1/1 taken)",
        "ghost": "node is not in the extender's cache (its watch has not shown it yet)",
    }
    assert body["FailedAndUnresolvableNodes"] == {
        "node-c": "gpu-memory 20000 MiB exceeds every GPU on this node (16384 MiB)"
    }
    assert body["Error"] == ""


def test_filter_full_node_list_answers_with_node_objects(client: httpx.Client) -> None:
    answer = post(client, "filter", full_list(pod(memory=8000), NODES))
    body = answer.json()
    assert answer.status_code == 200
    assert body["NodeNames"] is None
    assert body["Nodes"]["items"] == [NODES[0], NODES[2]]
    assert list(body["FailedNodes"]) == ["node-b"]


def test_node_sent_in_full_but_unknown_to_the_cache_is_judged_from_the_object(
    client: httpx.Client,
) -> None:
    fresh = node("node-new", gpus=1)
    body = post(client, "filter", full_list(pod(), [fresh])).json()
    assert [n["metadata"]["name"] for n in body["Nodes"]["items"]] == ["node-new"]


def test_keys_are_accepted_in_any_case(client: httpx.Client) -> None:
    body = {"pod": pod(), "nodenames": ["node-a"], "NODES": None}
    assert post(client, "filter", body).json()["NodeNames"] == ["node-a"]


def test_prioritize_scores_every_node(client: httpx.Client) -> None:
    answer = post(client, "prioritize", names_only(pod(duty=25), ["node-a", "node-b", "ghost"]))
    assert answer.status_code == 200
    scores = answer.json()
    assert [s["Host"] for s in scores] == ["node-a", "node-b", "ghost"]
    assert all(set(s) == {"Host", "Score"} for s in scores)
    assert 0 < scores[0]["Score"] <= 10
    assert scores[1]["Score"] == scores[2]["Score"] == 0


def test_pod_without_baton_resources_passes_through(client: httpx.Client) -> None:
    plain = pod(gpus=None)
    names = ["node-a", "node-b", "ghost"]
    body = post(client, "filter", names_only(plain, names)).json()
    assert body["NodeNames"] == names
    assert body["FailedNodes"] == body["FailedAndUnresolvableNodes"] == {}
    scores = post(client, "prioritize", names_only(plain, names)).json()
    assert {s["Score"] for s in scores} == {0}


def test_bad_pod_request_is_unresolvable_everywhere_with_the_field_named(
    client: httpx.Client,
) -> None:
    body = post(client, "filter", names_only(pod(duty=150), ["node-a", "node-b"])).json()
    assert body["NodeNames"] == []
    assert set(body["FailedAndUnresolvableNodes"]) == {"node-a", "node-b"}
    reason = body["FailedAndUnresolvableNodes"]["node-a"]
    assert "baton.dev/gpu-duty 150 is not above 0 and at most 100" in reason


@pytest.mark.parametrize(
    ("verb", "body", "message"),
    [
        ("filter", b"{not json", "request body is not valid JSON"),
        ("filter", b"[1, 2]", "request body must be a JSON object"),
        ("filter", {"NodeNames": ["node-a"]}, "field Pod is missing"),
        ("filter", {"Pod": {}, "NodeNames": None, "Nodes": None}, "NodeNames and Nodes are both"),
        ("prioritize", {"Pod": {}, "NodeNames": "node-a"}, "field NodeNames must be a list"),
        ("bind", {"PodName": "p", "PodNamespace": "default", "PodUID": "u"}, "field Node is"),
        ("bind", b"", "request body is not valid JSON"),
    ],
)
def test_bad_input_gets_400_naming_the_field(
    client: httpx.Client, verb: str, body: Any, message: str
) -> None:
    answer = post(client, verb, body)
    assert answer.status_code == 400
    assert message in answer.json()["Error"]
    assert "Traceback" not in answer.text


def test_bind_without_api_server_answers_error(client: httpx.Client) -> None:
    args = {"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "node-a"}
    answer = post(client, "bind", args)
    assert answer.status_code == 200
    assert answer.json() == {"Error": "this extender runs without an API server and cannot bind"}


def test_readyz_waits_for_the_cache() -> None:
    cache = ClusterCache(ClusterState(Limits(), time.monotonic))
    with ServerThread(create_app(cache, None, Metrics())) as server:
        url = f"http://127.0.0.1:{server.port}"
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
        not_ready = httpx.get(f"{url}/readyz", timeout=10)
        assert not_ready.status_code == 503
        assert "not synced" in not_ready.text
        filtered = httpx.post(f"{url}/filter", json=names_only(pod(), ["n"]), timeout=10).json()
        assert "not synced" in filtered["Error"]
        cache.mark_synced("nodes")
        cache.mark_synced("pods")
        assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200


def test_inventory_and_metrics(client: httpx.Client) -> None:
    inventory = client.get("/v1/inventory").json()
    assert inventory["synced"] is True
    by_name = {n["name"]: n for n in inventory["nodes"]}
    gpu = by_name["node-b"]["gpus"][0]
    assert gpu["freeSlots"] == 0
    assert gpu["tenants"][0]["pod"] == "default/busy"
    assert gpu["summedDuty"] == 100.0
    assert by_name["node-a"]["hostMemoryBudgetMiB"] == 256 * 1024
    text = client.get("/metrics").text
    assert 'baton_extender_requests_total{code="400",verb="bind"}' in text
    assert "baton_extender_cache_nodes 3.0" in text


def test_preempt_keeps_nodes_where_the_victims_free_a_gpu(client: httpx.Client) -> None:
    busy = BUSY[0]["metadata"]["uid"]
    args = {
        "Pod": pod(memory=20000),
        "NodeNameToVictims": None,
        "NodeNameToMetaVictims": {
            "node-b": {"Pods": [{"UID": busy}], "NumPDBViolations": 1},
            "node-c": {"Pods": [], "NumPDBViolations": 0},
        },
    }
    answer = post(client, "preempt", args)
    assert answer.status_code == 200
    assert answer.json() == {
        "NodeNameToMetaVictims": {"node-b": {"Pods": [{"UID": busy}], "NumPDBViolations": 1}}
    }
    args["NodeNameToMetaVictims"] = {"node-b": {"Pods": [], "NumPDBViolations": 0}}
    assert post(client, "preempt", args).json() == {"NodeNameToMetaVictims": {}}


def test_preempt_accepts_full_victim_pods(client: httpx.Client) -> None:
    args = {
        "Pod": pod(memory=1000),
        "NodeNameToVictims": {"node-b": {"Pods": BUSY, "NumPDBViolations": 0}},
        "NodeNameToMetaVictims": None,
    }
    result = post(client, "preempt", args).json()["NodeNameToMetaVictims"]
    assert result == {
        "node-b": {"Pods": [{"UID": BUSY[0]["metadata"]["uid"]}], "NumPDBViolations": 0}
    }


class _WatchedState(ClusterState):
    """Records, each time preempt builds a node without its victims, whether the cache's lock
    (the one the watch threads change the state under) was held."""

    lock_held: list[bool]
    cache: ClusterCache

    def node_without(self, name: str, uids: set[str]) -> Any:
        self.lock_held.append(self.cache.lock.locked())
        return super().node_without(name, uids)


def test_preempt_reads_the_pods_under_the_lock_the_watches_change_them_under() -> None:
    """Unlocked, a watch event landing while preempt walked a node's pods ended the request in
    a 500 ('Set changed size during iteration')."""
    state = _WatchedState(Limits(), time.monotonic)
    state.lock_held = []
    state.cache = ClusterCache.filled(state, NODES, BUSY)
    busy = BUSY[0]["metadata"]["uid"]
    args = {
        "Pod": pod(memory=20000),
        "NodeNameToMetaVictims": {"node-b": {"Pods": [{"UID": busy}], "NumPDBViolations": 0}},
    }
    with (
        ServerThread(create_app(state.cache, None, Metrics())) as server,
        httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=10) as c,
    ):
        assert post(c, "preempt", args).status_code == 200
    assert state.lock_held == [True]


class _SentNodeState(ClusterState):
    """Records, each time a verb builds a node kube-scheduler sent but the cache does not know,
    whether the cache's lock (the one the watch threads change the pod tables under) was held."""

    lock_held: list[bool]
    cache: ClusterCache

    def node_from_object(self, node: dict[str, Any]) -> Any:
        self.lock_held.append(self.cache.lock.locked())
        return super().node_from_object(node)


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_a_sent_node_is_built_under_the_lock_the_watches_change_the_pods_under(verb: str) -> None:
    """Unlocked, a watch event landing while filter or prioritize built a node from the object
    kube-scheduler sent (`nodeCacheCapable: false`) ended the request in a 500 ('Set changed
    size during iteration')."""
    state = _SentNodeState(Limits(), time.monotonic)
    state.lock_held = []
    state.cache = ClusterCache.filled(state, NODES, BUSY)
    fresh = node("node-new", gpus=1)
    with (
        ServerThread(create_app(state.cache, None, Metrics())) as server,
        httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=10) as c,
    ):
        assert post(c, verb, full_list(pod(memory=8000), [NODES[0], fresh])).status_code == 200
    assert state.lock_held == [True]

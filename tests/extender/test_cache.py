"""The cluster cache against the fake API server: list, watch, relist after errors."""

from __future__ import annotations

import json

from baton.contract.names import ANNOTATION_GPUS
from extender.cache import KubeCache
from extender.state import ClusterState
from tests.extender.builders import gpu_entry, node, pod
from tests.extender.conftest import SYNC_TIMEOUT_S
from tests.harness.fakeapi import FakeApiServer


def tenants(state: ClusterState, name: str) -> list[str]:
    found = state.node(name)
    return [t for g in found.gpus for t in g.tenants] if found else []


def test_watch_follows_nodes_and_pods(fake_api: FakeApiServer, kube_cache: KubeCache) -> None:
    fake_api.put_object(node("n1", gpus=1))
    bound = fake_api.put_object(pod("a", node_name="n1", assigned=["GPU-n1-0"]))
    uid = bound["metadata"]["uid"]
    assert kube_cache.wait_for(lambda s: tenants(s, "n1") == [uid], SYNC_TIMEOUT_S)

    sick = node("n1", gpus=[gpu_entry("GPU-n1-0", healthy=False)])
    fake_api.put_object(sick)
    assert kube_cache.wait_for(
        lambda s: not s.node("n1").gpus[0].gpu.healthy,  # type: ignore[union-attr]
        SYNC_TIMEOUT_S,
    )
    done = fake_api.get_object("Pod", "a")
    assert done is not None
    done["status"]["phase"] = "Succeeded"
    fake_api.put_object(done)
    assert kube_cache.wait_for(lambda s: tenants(s, "n1") == [], SYNC_TIMEOUT_S)
    fake_api.remove_object("Node", "n1", namespace="")
    assert kube_cache.wait_for(lambda s: s.node("n1") is None, SYNC_TIMEOUT_S)


def test_pods_deleted_free_their_slots(fake_api: FakeApiServer, kube_cache: KubeCache) -> None:
    fake_api.put_object(node("n1", gpus=1))
    fake_api.put_object(pod("a", node_name="n1", assigned=["GPU-n1-0"]))
    assert kube_cache.wait_for(lambda s: len(tenants(s, "n1")) == 1, SYNC_TIMEOUT_S)
    fake_api.remove_object("Pod", "a")
    assert kube_cache.wait_for(lambda s: tenants(s, "n1") == [], SYNC_TIMEOUT_S)


def test_outage_leads_to_a_fresh_start(fake_api: FakeApiServer, kube_cache: KubeCache) -> None:
    fake_api.put_object(node("n1", gpus=1))
    assert kube_cache.wait_for(lambda s: s.node("n1") is not None, SYNC_TIMEOUT_S)
    fake_api.stop()
    fake_api.clear_requests()
    fake_api.put_object(node("n2", gpus=2))
    fake_api.put_object(pod("a", node_name="n2", assigned=["GPU-n2-1"]))
    fake_api.start()
    assert kube_cache.wait_for(lambda s: len(tenants(s, "n2")) == 1, SYNC_TIMEOUT_S)
    assert kube_cache.wait_for(lambda s: s.node("n2") is not None, SYNC_TIMEOUT_S)
    assert fake_api.requests(resource="nodes"), "the cache never came back to the API server"


def test_expired_history_leads_to_a_relist(
    fake_api: FakeApiServer, kube_cache: KubeCache, restarts: list[tuple[str, str]]
) -> None:
    fake_api.put_object(node("n1", gpus=1))
    assert kube_cache.wait_for(lambda s: s.node("n1") is not None, SYNC_TIMEOUT_S)
    lists_before = len(fake_api.requests("list", "nodes"))
    with fake_api.atomically():
        fake_api.put_object(node("n2", gpus=2))
        fake_api.put_object(pod("a", node_name="n2", assigned=["GPU-n2-1"]))
        fake_api.compact_history()
    assert kube_cache.wait_for(lambda s: len(tenants(s, "n2")) == 1, SYNC_TIMEOUT_S)
    assert kube_cache.wait_for(lambda s: s.node("n2") is not None, SYNC_TIMEOUT_S)
    gone = "API server answered 410: too old resource version"
    assert any(kind == "nodes" and why.startswith(gone) for kind, why in restarts), restarts
    assert len(fake_api.requests("list", "nodes")) > lists_before


def test_unreadable_annotation_is_reported_per_node(
    fake_api: FakeApiServer, kube_cache: KubeCache
) -> None:
    broken = node("n1")
    broken["metadata"]["annotations"][ANNOTATION_GPUS] = json.dumps({"not": "a list"})
    fake_api.put_object(broken)
    assert kube_cache.wait_for(lambda s: s.node("n1") is not None, SYNC_TIMEOUT_S)
    problem = kube_cache.state.node("n1").problem  # type: ignore[union-attr]
    assert problem.startswith("node annotation baton.dev/gpus is unreadable")


def test_an_infinite_number_in_one_nodes_annotation_fails_that_node_only(
    fake_api: FakeApiServer, kube_cache: KubeCache
) -> None:
    """1e999 is valid JSON (a float infinity once read): the node gets the reason, and the
    watch goes on applying the other nodes' changes instead of relisting for ever."""
    broken = node("n1", gpus=1)
    entries = json.loads(broken["metadata"]["annotations"][ANNOTATION_GPUS])
    text = json.dumps(entries).replace('"memoryMiB": 81920', '"memoryMiB": 1e999')
    broken["metadata"]["annotations"][ANNOTATION_GPUS] = text
    fake_api.put_object(broken)
    fake_api.put_object(node("n2", gpus=1))
    assert kube_cache.wait_for(lambda s: s.node("n2") is not None, SYNC_TIMEOUT_S)
    problem = kube_cache.state.node("n1").problem  # type: ignore[union-attr]
    assert problem.startswith("node annotation baton.dev/gpus is unreadable"), problem

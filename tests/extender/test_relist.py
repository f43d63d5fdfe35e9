"""A relist is rebuilt off the cache's lock: the verbs answer while it runs, from the state as it
was, and what binds did meanwhile is in the state swapped in (`extender.relist`)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from baton.contract.draclaim import ClaimRef
from extender.app import create_app
from extender.bind import Binder
from extender.cache import KubeCache
from extender.inventory import Assignment
from extender.kubeapi import KubePodApi
from extender.metrics import Metrics
from extender.placement import Limits
from extender.server import ServerThread
from extender.snapshot import PlacedPod
from extender.state import ClusterState
from tests.extender.builders import node, pod
from tests.extender.conftest import SYNC_TIMEOUT_S
from tests.extender.test_dra_state import claim, claim_pod
from tests.harness.fakeapi import FakeApiServer

WAIT_S = 5.0
ANSWER_S = 2.0
"""How long a verb may take while a relist runs (kube-scheduler's httpTimeout is 5 s)."""


class HeldRelist:
    """`time.monotonic`, except that the pods' relist stops in it, once armed, until released:
    a rebuild of the cache that takes as long as the test wants (a large cluster's does)."""

    def __init__(self) -> None:
        self.armed = threading.Event()
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self) -> float:
        if self.armed.is_set() and threading.current_thread().name == "watch-pods":
            self.entered.set()
            self.release.wait(WAIT_S)
        return time.monotonic()


@pytest.fixture
def held() -> Iterator[HeldRelist]:
    held = HeldRelist()
    yield held
    held.release.set()


@pytest.fixture
def held_cache(api_client: Any, held: HeldRelist) -> Iterator[KubeCache]:
    cache = KubeCache(ClusterState(Limits(), held), api_client).start()
    try:
        assert cache.wait_synced(SYNC_TIMEOUT_S), "the cache did not list nodes and pods"
        yield cache
    finally:
        held.release.set()
        cache.stop()


def tenants(state: ClusterState, name: str) -> list[str]:
    found = state.node(name)
    return [t for g in found.gpus for t in g.tenants] if found else []


def post(client: httpx.Client, verb: str, body: Any) -> httpx.Response:
    return client.post(f"/{verb}", content=json.dumps(body).encode(), timeout=ANSWER_S)


def test_the_verbs_answer_while_a_relist_is_rebuilt_and_a_bind_made_meanwhile_is_kept(
    fake_api: FakeApiServer, api_client: Any, held_cache: KubeCache, held: HeldRelist
) -> None:
    """Rebuilt under the lock (taken on the event loop), a relist of a large cluster held every
    request for seconds: past kube-scheduler's httpTimeout, the scheduling cycle failed."""
    gpu_node = fake_api.put_object(node("n1", gpus=1, slots=2))
    running = fake_api.put_object(pod("running", node_name="n1", assigned=["GPU-n1-0"]))
    waiting = fake_api.put_object(pod("waiting"))
    uid, busy = waiting["metadata"]["uid"], running["metadata"]["uid"]
    assert held_cache.wait_for(
        lambda s: tenants(s, "n1") == [busy] and s.pending_pod(uid) is not None, SYNC_TIMEOUT_S
    )
    binder = Binder(held_cache, KubePodApi(api_client), time.time_ns)
    app = create_app(held_cache, binder, Metrics())
    with (
        ServerThread(app, on_stop=binder.close) as server,
        httpx.Client(base_url=f"http://127.0.0.1:{server.port}") as client,
    ):
        held.armed.set()
        with fake_api.atomically():  # the watches get 410 Gone: nodes and pods are relisted
            fake_api.put_object(pod("other", namespace="elsewhere"))
            fake_api.compact_history()
        assert held.entered.wait(WAIT_S), "the pods were not relisted"

        sent = {"Pod": waiting, "Nodes": {"items": [gpu_node]}, "NodeNames": None}
        assert post(client, "filter", sent).json()["Nodes"]["items"][0]["metadata"]["name"] == "n1"
        victims = {"n1": {"Pods": [{"UID": busy}], "NumPDBViolations": 0}}
        preempt = {"Pod": pod(memory=1000), "NodeNameToMetaVictims": victims}
        assert post(client, "preempt", preempt).json()["NodeNameToMetaVictims"] == victims
        bind = {"PodName": "waiting", "PodNamespace": "default", "PodUID": uid, "Node": "n1"}
        assert post(client, "bind", bind).json() == {"Error": ""}
        assert not held.release.is_set()  # every answer came while the relist was held

        watches = len(fake_api.requests("watch", "pods"))
        fake_api.fail_next("watch", "pods", 500)  # the watch after the relist: held back
        held.release.set()
        fake_api.wait_for_requests("watch", "pods", watches + 1, WAIT_S)
        with held_cache.lock:  # swapped in, before any watch event: the bind is counted
            assert sorted(tenants(held_cache.state, "n1")) == sorted([busy, uid])
            assert set(held_cache.state.assumed()) == {uid}
        assert held_cache.wait_for(lambda s: not s.assumed(), SYNC_TIMEOUT_S)
        assert sorted(tenants(held_cache.state, "n1")) == sorted([busy, uid])


def assignment(p: dict[str, Any], gpu: str = "GPU-n1-0") -> Assignment:
    uid = p["metadata"]["uid"]
    return Assignment(uid, f"default/{p['metadata']['name']}", "n1", (gpu,), PlacedPod(uid))


def test_changes_made_while_a_relist_is_rebuilt_are_replayed_on_it() -> None:
    state = ClusterState(Limits(), time.monotonic)
    state.replace_nodes([node("n1", gpus=1, slots=4)])
    stale, kept, dropped = pod("stale"), pod("kept"), pod("dropped")
    state.replace_pods([stale, kept, dropped])
    state.assume(assignment(stale))
    state.assume(assignment(dropped))

    fork = state.fork()
    fork.replace_pods([stale, kept, dropped, pod("new")])
    state.assume(assignment(kept))  # binds answered while the relist was rebuilt
    state.forget(dropped["metadata"]["uid"])
    state.keep_unsure(stale["metadata"]["uid"])
    state.upsert_node(node("n2", gpus=1))
    seen = set(tenants(state, "n1"))
    state.adopt(fork)

    assert set(tenants(state, "n1")) == seen == {p["metadata"]["uid"] for p in (stale, kept)}
    assert set(state.assumed()) == {kept["metadata"]["uid"]}
    assert state.node("n2") is not None
    assert state.journal is None
    with pytest.raises(RuntimeError, match="adopt it first"):
        state.fork(), state.fork()


def test_a_claim_allocated_while_the_pods_are_relisted_counts_after_the_swap() -> None:
    state = ClusterState(Limits(), time.monotonic, dra=True)
    state.replace_nodes([node("n1", gpus=2)])
    held, later = claim_pod("a", "a-gpu", node_name="n1"), claim_pod("b", "b-gpu", node_name="n1")
    state.replace_claims([claim("a-gpu", node_name="n1", device="gpu-0", pod_uid="uid-a")])

    fork = state.fork()
    fork.replace_pods([held, later])
    state.upsert_claim(claim("b-gpu", node_name="n1", device="gpu-1", pod_uid="uid-b"))
    state.adopt(fork)

    assert [g.tenants for g in state.node("n1").gpus] == [("uid-a",), ("uid-b",)]  # type: ignore[union-attr]
    assert state.claim_asks(ClaimRef("default", "b-gpu")) is not None

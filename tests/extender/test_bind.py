"""Bind against the fake API server: annotations, preconditions, conflicts, races, outages."""

from __future__ import annotations

import asyncio
import functools
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from baton.contract.kube import parse_timestamp_ns
from baton.contract.names import ANNOTATION_ASSIGNED_AT, ANNOTATION_ASSIGNED_GPUS
from extender.bind import Binder
from extender.cache import ClusterCache, KubeCache
from extender.kubeapi import KubePodApi
from extender.placement import Limits
from extender.state import ClusterState
from extender.wire import BindingArgs
from tests.extender.binding import bind_once
from tests.extender.builders import node, pod
from tests.extender.conftest import SYNC_TIMEOUT_S
from tests.harness.fakeapi import FakeApiServer


def put_pending(fake: FakeApiServer, name: str, **kwargs: Any) -> dict[str, Any]:
    return fake.put_object(pod(name, **kwargs))


def args_for(p: dict[str, Any], node_name: str) -> BindingArgs:
    meta = p["metadata"]
    return BindingArgs(meta["name"], meta["namespace"], meta["uid"], node_name)


def assigned(fake: FakeApiServer, name: str) -> list[str]:
    obj = fake.get_object("Pod", name) or {}
    notes = obj.get("metadata", {}).get("annotations") or {}
    return [g for g in notes.get(ANNOTATION_ASSIGNED_GPUS, "").split(",") if g]


@pytest.fixture
def binder(kube_cache: KubeCache, api_client: Any) -> Binder:
    return Binder(kube_cache, KubePodApi(api_client), time.time_ns)


@pytest.fixture
def gpu_node(fake_api: FakeApiServer, kube_cache: KubeCache) -> str:
    fake_api.put_object(node("gpu-1", gpus=2, slots=1))
    assert kube_cache.wait_for(lambda s: s.node("gpu-1") is not None, SYNC_TIMEOUT_S)
    return "gpu-1"


def test_bind_writes_the_assignment_with_the_binding_and_the_watch_confirms(
    fake_api: FakeApiServer, kube_cache: KubeCache, binder: Binder, gpu_node: str
) -> None:
    p = put_pending(fake_api, "trainer", memory=1000, duty=50)
    before = time.time_ns()
    assert bind_once(binder, args_for(p, gpu_node)) == ""
    stored = fake_api.get_object("Pod", "trainer")
    assert stored is not None
    assert stored["spec"]["nodeName"] == gpu_node
    assert assigned(fake_api, "trainer") == ["GPU-gpu-1-0"]
    at = parse_timestamp_ns(stored["metadata"]["annotations"][ANNOTATION_ASSIGNED_AT])
    assert before <= at <= time.time_ns()
    assert fake_api.requests("patch", "pods") == []  # one write: the Binding carries them
    binding = fake_api.requests("create", "pods/binding")[0]
    assert binding.path == "/api/v1/namespaces/default/pods/trainer/binding"
    uid = p["metadata"]["uid"]
    assert kube_cache.wait_for(
        lambda s: not s.assumed() and uid in s.node(gpu_node).gpus[0].tenants,  # type: ignore[union-attr]
        SYNC_TIMEOUT_S,
    )


def cached(kube_cache: KubeCache, p: dict[str, Any]) -> None:
    """Wait until the extender's watch has shown it the pending pod."""
    uid = p["metadata"]["uid"]
    assert kube_cache.wait_for(lambda s: s.pending_pod(uid) is not None, SYNC_TIMEOUT_S)


def test_a_pod_the_watch_showed_is_bound_in_one_api_call(
    fake_api: FakeApiServer, kube_cache: KubeCache, binder: Binder, gpu_node: str
) -> None:
    p = put_pending(fake_api, "trainer")
    cached(kube_cache, p)
    before = len(fake_api.requests())
    assert bind_once(binder, args_for(p, gpu_node)) == ""
    made = fake_api.requests()[before:]
    assert [(r.verb, r.resource) for r in made if r.verb != "watch"] == [("create", "pods/binding")]


def test_conflict_is_refreshed_and_retried_once(
    fake_api: FakeApiServer, kube_cache: KubeCache, binder: Binder, gpu_node: str
) -> None:
    p = put_pending(fake_api, "trainer")
    cached(kube_cache, p)
    fake_api.fail_next("create", "pods/binding", 409, message="the object has been modified")
    assert bind_once(binder, args_for(p, gpu_node)) == ""
    assert len(fake_api.requests("create", "pods/binding")) == 2
    assert len(fake_api.requests("get", "pods")) == 1  # the retry reads the pod afresh
    assert assigned(fake_api, "trainer") == ["GPU-gpu-1-0"]


def test_stale_resource_version_is_a_real_conflict_and_retried(
    fake_api: FakeApiServer, kube_cache: KubeCache, api_client: Any, gpu_node: str
) -> None:
    p = put_pending(fake_api, "trainer")

    class RacingApi(KubePodApi):
        """Someone else updates the pod between our read and our binding, once."""

        raced = False

        async def bind_pod(self, namespace, name, uid, node, resource_version="", annotations=None):
            if not self.raced:
                self.raced = True
                obj = fake_api.get_object("Pod", name)
                assert obj is not None
                obj["metadata"].setdefault("labels", {})["touched"] = "yes"
                fake_api.put_object(obj)
            await super().bind_pod(namespace, name, uid, node, resource_version, annotations)

    binder = Binder(kube_cache, RacingApi(api_client), time.time_ns)
    assert bind_once(binder, args_for(p, gpu_node)) == ""
    assert len(fake_api.requests("create", "pods/binding")) == 2
    stored = fake_api.get_object("Pod", "trainer")
    assert stored is not None and stored["metadata"]["labels"]["touched"] == "yes"


def test_two_conflicts_answer_error_and_leave_no_assumption(
    fake_api: FakeApiServer, kube_cache: KubeCache, binder: Binder, gpu_node: str
) -> None:
    p = put_pending(fake_api, "trainer")
    fake_api.fail_next("create", "pods/binding", 409, times=2)
    error = bind_once(binder, args_for(p, gpu_node))
    assert "binding pod default/trainer to gpu-1: conflict twice in a row" in error
    assert "409" in error
    assert kube_cache.state.assumed() == {}
    stored = fake_api.get_object("Pod", "trainer")
    assert stored is not None and not stored["spec"].get("nodeName")


def test_api_outage_answers_error_and_leaves_no_assumption(
    fake_api: FakeApiServer, kube_cache: KubeCache, binder: Binder, gpu_node: str
) -> None:
    p = put_pending(fake_api, "trainer")
    fake_api.stop()
    error = bind_once(binder, args_for(p, gpu_node))
    assert "binding pod default/trainer" in error and "API server unreachable" in error
    assert kube_cache.state.assumed() == {}


def test_binding_refused_after_annotation_drops_the_assumption(
    fake_api: FakeApiServer, kube_cache: KubeCache, binder: Binder, gpu_node: str
) -> None:
    p = put_pending(fake_api, "trainer")
    fake_api.fail_next("create", "pods/binding", 500, message="etcd is unhappy")
    error = bind_once(binder, args_for(p, gpu_node))
    assert "binding pod default/trainer: API server answered 500: etcd is unhappy" in error
    assert kube_cache.state.assumed() == {}
    state = kube_cache.state.node(gpu_node)
    assert state is not None and all(not g.tenants for g in state.gpus)


def test_two_pods_bound_back_to_back_never_share_a_slot(
    fake_api: FakeApiServer, api_client: Any
) -> None:
    """No watch runs here: only the assumptions keep the second bind off the first's slot."""
    fake_api.put_object(node("gpu-1", gpus=2, slots=1))
    pods = [put_pending(fake_api, f"trainer-{i}", memory=1000, duty=10) for i in range(3)]
    stored = fake_api.get_object("Node", "gpu-1", namespace="")
    assert stored is not None
    cache = ClusterCache.filled(ClusterState(Limits(), time.monotonic), [stored], [])
    binder = Binder(cache, KubePodApi(api_client), time.time_ns)
    with ThreadPoolExecutor(2) as pool:
        errors = list(
            pool.map(functools.partial(bind_once, binder), [args_for(p, "gpu-1") for p in pods[:2]])
        )
    assert errors == ["", ""]
    first, second = assigned(fake_api, "trainer-0"), assigned(fake_api, "trainer-1")
    assert len(first) == len(second) == 1
    assert first != second
    third = bind_once(binder, args_for(pods[2], "gpu-1"))
    assert "it no longer fits: no GPU can take it" in third
    assert "has no free slot (1/1 taken)" in third


def one_slot_two_pending(
    fake_api: FakeApiServer, api_client: Any
) -> tuple[Binder, ClusterState, dict[str, Any], dict[str, Any]]:
    """A binder over a cache filled once (no watch) with node gpu-1 of one slot and two pending
    pods, trainer-0 and trainer-1, that each take it; the cache's state."""
    fake_api.put_object(node("gpu-1", gpus=1, slots=1))
    first, second = (put_pending(fake_api, f"trainer-{i}", memory=1000, duty=10) for i in (0, 1))
    stored = fake_api.get_object("Node", "gpu-1", namespace="")
    assert stored is not None
    state = ClusterState(Limits(), time.monotonic)
    cache = ClusterCache.filled(state, [stored], [first, second])
    return Binder(cache, KubePodApi(api_client), time.time_ns), state, first, second


def test_a_bind_sent_without_an_answer_keeps_its_slot(
    fake_api: FakeApiServer, api_client: Any
) -> None:
    """The Binding went out and its answer was lost (here the API server did bind the pod):
    until the watch says otherwise the slot stays assumed, and the next pod does not get it."""
    # No watch: the pods stay pending in the cache, and only the assumptions count.
    binder, state, first, second = one_slot_two_pending(fake_api, api_client)
    fake_api.lose_answer_next("create", "pods/binding")
    error = bind_once(binder, args_for(first, "gpu-1"))
    assert "API server unreachable" in error and "it may have taken effect" in error, error
    bound = fake_api.get_object("Pod", "trainer-0")
    assert bound is not None and bound["spec"]["nodeName"] == "gpu-1"
    retried = bind_once(binder, args_for(first, "gpu-1"))  # kube-scheduler tries it again
    assert "has no free slot (1/1 taken)" in retried, retried
    refused = bind_once(binder, args_for(second, "gpu-1"))
    assert "has no free slot (1/1 taken)" in refused, refused
    state.upsert_pod(bound)  # the watch shows it bound: counted as confirmed, once
    gpu = state.node("gpu-1").gpus[0]  # type: ignore[union-attr]
    assert gpu.tenants == (first["metadata"]["uid"],) and state.assumed() == {}


def test_a_bind_resent_after_a_reset_and_refused_keeps_its_slot(
    fake_api: FakeApiServer, api_client: Any
) -> None:
    """The Binding went out on a kept-alive connection, the API server bound the pod and the
    connection died before the answer: sent again, it is refused (the pod is bound). That
    refusal is not the bind's fate: the slot stays assumed, and the next pod does not get it."""
    fake_api.put_object(node("gpu-1", gpus=1, slots=2))
    pods = [put_pending(fake_api, f"trainer-{i}", memory=1000, duty=10) for i in (0, 1, 2)]
    stored = fake_api.get_object("Node", "gpu-1", namespace="")
    assert stored is not None
    cache = ClusterCache.filled(ClusterState(Limits(), time.monotonic), [stored], pods)
    binder = Binder(cache, KubePodApi(api_client), time.time_ns)

    async def binds() -> list[str]:  # one event loop: the second bind reuses the connection
        try:
            answers = [await binder.bind(args_for(pods[0], "gpu-1"))]
            fake_api.lose_answer_next("create", "pods/binding")
            answers.append(await binder.bind(args_for(pods[1], "gpu-1")))
            answers.append(await binder.bind(args_for(pods[2], "gpu-1")))
            return answers
        finally:
            binder.close()

    first, resent, third = asyncio.run(binds())
    assert first == ""
    sent = [r.path.split("/")[-2] for r in fake_api.requests("create", "pods/binding")]
    assert sent == ["trainer-0", "trainer-1", "trainer-1"], "trainer-1's twice, no trainer-2"
    bound = fake_api.get_object("Pod", "trainer-1")
    assert bound is not None and bound["spec"]["nodeName"] == "gpu-1"
    assert "answered 409" in resent and "the first may have taken effect" in resent, resent
    assert "has no free slot (2/2 taken)" in third, third


def test_a_bind_the_api_server_gave_up_on_keeps_its_slot(
    fake_api: FakeApiServer, api_client: Any
) -> None:
    """A 504 is kube-apiserver giving up waiting, not a refusal: the write may still land."""
    binder, _, first, second = one_slot_two_pending(fake_api, api_client)
    fake_api.fail_next("create", "pods/binding", 504, message="Timeout: request did not complete")
    error = bind_once(binder, args_for(first, "gpu-1"))
    assert "answered 504: Timeout: request did not complete" in error, error
    assert "it may still take effect" in error, error
    refused = bind_once(binder, args_for(second, "gpu-1"))
    assert "has no free slot (1/1 taken)" in refused, refused


def test_uid_mismatch_is_refused(fake_api: FakeApiServer, binder: Binder, gpu_node: str) -> None:
    p = put_pending(fake_api, "trainer")
    stale = BindingArgs("trainer", "default", "not-the-uid", gpu_node)
    assert f"the pod now has UID {p['metadata']['uid']}" in bind_once(binder, stale)
    assert fake_api.requests("create", "pods/binding") == []


@pytest.mark.parametrize("scheduler", [None, "default-scheduler", "team-b-scheduler"])
def test_a_pod_of_another_scheduler_is_not_bound(
    fake_api: FakeApiServer,
    kube_cache: KubeCache,
    binder: Binder,
    gpu_node: str,
    scheduler: str | None,
) -> None:
    """The extender binds with its own service account for the baton-scheduler profile only:
    a /bind naming a pod another scheduler places (any pod in the cluster can reach the port)
    must not bind it, with or without Baton resources, nor take a GPU slot for it."""
    for name, gpus in (("trainer", 1), ("web", None)):
        p = pod(name, gpus=gpus)
        if scheduler is None:
            del p["spec"]["schedulerName"]  # the API server's default: default-scheduler
        else:
            p["spec"]["schedulerName"] = scheduler
        fake_api.put_object(p)
        cached(kube_cache, p)
        error = bind_once(binder, args_for(p, gpu_node))
        named = scheduler or "default-scheduler"
        assert error == (
            f"binding pod default/{name} to gpu-1: its schedulerName is {named}, not "
            "baton-scheduler, the profile this extender binds for"
        ), error
    assert fake_api.requests("create", "pods/binding") == []
    assert kube_cache.state.assumed() == {}
    assert not (fake_api.get_object("Pod", "trainer") or {})["spec"].get("nodeName")


def test_on_the_dra_path_nothing_is_bound(fake_api: FakeApiServer, api_client: Any) -> None:
    """With --dra kube-scheduler allocates the claims and binds itself (the profile has no
    bindVerb): a /bind sent by anyone else must not bind a pod before its claims are allocated,
    nor onto a node the scheduler did not choose."""
    fake_api.put_object(node("gpu-1", gpus=1, slots=1))
    waiting = put_pending(fake_api, "trainer")
    stored = fake_api.get_object("Node", "gpu-1", namespace="")
    assert stored is not None
    state = ClusterState(Limits(), time.monotonic, dra=True)
    binder = Binder(
        ClusterCache.filled(state, [stored], [waiting]), KubePodApi(api_client), time.time_ns
    )
    error = bind_once(binder, args_for(waiting, "gpu-1"))
    assert error == (
        "binding pod default/trainer to gpu-1: on the DRA path (--dra) kube-scheduler binds "
        "pods itself; this extender binds none"
    ), error
    assert fake_api.requests("create", "pods/binding") == []


def test_pod_without_baton_resources_is_bound_without_annotations(
    fake_api: FakeApiServer, binder: Binder, gpu_node: str
) -> None:
    p = put_pending(fake_api, "web", gpus=None)
    assert bind_once(binder, args_for(p, gpu_node)) == ""
    assert fake_api.requests("patch", "pods") == []
    stored = fake_api.get_object("Pod", "web")
    assert stored is not None and stored["spec"]["nodeName"] == gpu_node


def test_a_pod_already_bound_is_left_alone(
    fake_api: FakeApiServer, binder: Binder, gpu_node: str
) -> None:
    p = fake_api.put_object(pod("running", node_name="elsewhere", assigned=["GPU-x"]))
    error = bind_once(binder, args_for(p, gpu_node))
    assert error == "binding pod default/running to gpu-1: it is already bound to node elsewhere"
    assert assigned(fake_api, "running") == ["GPU-x"]
    assert fake_api.requests("create", "pods/binding") == []


def test_a_bind_resent_for_a_pod_it_bound_keeps_the_slot(
    fake_api: FakeApiServer, api_client: Any
) -> None:
    """kube-scheduler sends a pod's bind again (its call timed out, but the bind went through)
    before the watch shows the pod bound: the second is refused, and the first's slot stays
    assumed, so the next pod does not get it."""
    # No watch: the pods stay pending in the cache (a watch lagging behind the binds).
    binder, _, first, second = one_slot_two_pending(fake_api, api_client)
    assert bind_once(binder, args_for(first, "gpu-1")) == ""
    resent = bind_once(binder, args_for(first, "gpu-1"))
    assert "a bind of it was sent already, to node gpu-1" in resent, resent
    refused = bind_once(binder, args_for(second, "gpu-1"))
    assert "has no free slot (1/1 taken)" in refused, refused
    bound = fake_api.get_object("Pod", "trainer-1")
    assert bound is not None and not bound["spec"].get("nodeName")


def test_a_bind_before_the_pods_are_listed_is_refused(
    fake_api: FakeApiServer, api_client: Any
) -> None:
    """Started (or restarted) with its nodes listed but not yet its pods, the extender sees every
    GPU empty: a bind then must not take a slot a running pod holds."""
    fake_api.put_object(node("gpu-1", gpus=1, slots=1))
    fake_api.put_object(pod("running", node_name="gpu-1", assigned=["GPU-gpu-1-0"]))
    waiting = put_pending(fake_api, "waiting")
    fake_api.hang_next("list", "pods")
    cache = KubeCache(ClusterState(Limits(), time.monotonic), api_client).start()
    try:
        assert cache.wait_for(lambda s: s.node("gpu-1") is not None, SYNC_TIMEOUT_S)
        assert not cache.synced()
        binder = Binder(cache, KubePodApi(api_client), time.time_ns)
        error = bind_once(binder, args_for(waiting, "gpu-1"))
        assert "the extender's cluster cache has not synced" in error, error
        assert fake_api.requests("create", "pods/binding") == []
        fake_api.release_hangs()
        assert cache.wait_synced(SYNC_TIMEOUT_S)
        refused = bind_once(binder, args_for(waiting, "gpu-1"))
        assert "has no free slot (1/1 taken)" in refused, refused
    finally:
        fake_api.release_hangs()
        cache.stop()

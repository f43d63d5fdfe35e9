"""The kubelet's allocation is the truth: every view of a container's GPU agrees with it.

The kubelet stub admits pods in its own order (not the extender's assigned-at order), one
container at a time, init containers first, and reports what it allocated on its PodResources
socket; the device plugin answers Allocate from the device IDs and reconciles the pods'
annotations from PodResources; the agent (a real one, watching the same fake API server) reads
them. For each container: its devices' GPU == BATON_GPUS == NVIDIA_VISIBLE_DEVICES == the pod's
annotation == the agent's view (and the extender's cache counts the pod's slots there).
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from baton.contract import names
from baton.contract.names import fake_gpu_uuid
from deviceplugin.daemon import Daemon
from extender.inventory import assignment
from tests.deviceplugin.conftest import NODE, admit, tenant_pod
from tests.harness.agent import AgentRunner, short_tmpdir
from tests.harness.fakeapi import FakeApiServer
from tests.harness.kubelet import KubeletStub
from tests.harness.podresources import AdmittedPod

GPU0, GPU1 = fake_gpu_uuid(0, NODE), fake_gpu_uuid(1, NODE)
GPU = names.RESOURCE_GPU


@pytest.fixture
def plugin(kubelet: KubeletStub, start_plugin: Any, fake_api: FakeApiServer, api_client: Any):
    daemon = start_plugin(api_client=api_client, slots=8)
    kubelet.wait_for_registrations(1)
    kubelet.wait_for_list(GPU, lambda devs: bool(devs))
    return daemon


@pytest.fixture
def agent(fake_api: FakeApiServer, tmp_path: Path) -> Iterator[AgentRunner]:
    kubeconfig = str(fake_api.kubeconfig_path(tmp_path))
    workdir = short_tmpdir()
    runner = AgentRunner(workdir, node_name=NODE, kubeconfig=kubeconfig).start()
    try:
        yield runner
    finally:
        runner.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def annotations_of(fake_api: FakeApiServer, name: str) -> dict[str, str]:
    pod = fake_api.get_object("Pod", name)
    assert pod is not None
    return dict(pod["metadata"].get("annotations") or {})


def wait_reconciled(plugin: Daemon, pods: list[str], timeout: float = 15.0) -> None:
    """Until the watch-fed cache shows every pod with its per-container GPUs recorded."""
    assert plugin.pod_cache is not None

    def done(views: list[Any]) -> bool:
        recorded = {v.name for v in views if v.container_gpus and v.allocated}
        return set(pods) <= recorded

    assert plugin.pod_cache.wait_for(done, timeout), "annotations not reconciled in time"
    assert plugin.reconciler is not None and plugin.reconciler.settle(timeout)


def assert_views_agree(
    fake_api: FakeApiServer, agent: AgentRunner, admitted: AdmittedPod
) -> dict[str, tuple[str, ...]]:
    """Each listed container's GPUs, after checking every view of them agrees."""
    found = annotations_of(fake_api, admitted.name)
    recorded = json.loads(found[names.ANNOTATION_CONTAINER_GPUS])
    truth: dict[str, tuple[str, ...]] = {}
    for container, devices in admitted.devices.items():
        gpus = names.gpus_of_device_ids(devices)
        env = admitted.envs[container]
        assert env[names.ENV_GPUS] == ",".join(gpus), (admitted.name, container)
        assert env[names.ENV_NVIDIA_VISIBLE_DEVICES] == ",".join(gpus), (admitted.name, container)
        if container in admitted.listed:
            assert tuple(recorded[container]) == gpus, (admitted.name, container, recorded)
            truth[container] = gpus
    assert set(recorded) == set(truth), "only the containers the kubelet lists are recorded"
    union = sorted({g for gpus in truth.values() for g in gpus})
    assert found[names.ANNOTATION_ASSIGNED_GPUS] == ",".join(union)
    obj = fake_api.get_object("Pod", admitted.name)
    held = assignment({**obj, "status": {"phase": "Running"}}) if obj else None
    assert held is not None and list(held.gpus) == union, "the extender's cache counts the truth"
    view = agent_view(agent, f"default/{admitted.name}", truth)
    assert view["gpus"] == union
    return truth


def agent_view(
    agent: AgentRunner, tenant_id: str, truth: dict[str, tuple[str, ...]]
) -> dict[str, Any]:
    """The agent's tenant once it shows `truth`: rechecked after each of the tenant's changes."""
    since = 0
    deadline = time.monotonic() + 10
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"the agent never showed {tenant_id} on {truth}"
        event = agent.wait_event(
            lambda e: e.tenant_id == tenant_id and e.kind == "tenant_joined", remaining, since
        )
        since = next(i for i in range(since, len(agent.seen)) if agent.seen[i] is event) + 1
        view: dict[str, Any] = agent.status()["tenants"].get(tenant_id) or {}
        if {c: tuple(g) for c, g in view.get("container_gpus", {}).items()} == truth:
            return view


def test_many_pods_admitted_out_of_order_each_container_agrees_with_the_kubelet(
    fake_api: FakeApiServer, plugin: Daemon, kubelet: KubeletStub, agent: AgentRunner
) -> None:
    count = 12
    pods = [
        tenant_pod(f"t{i:02d}", (GPU0 if i % 2 == 0 else GPU1,), assigned_at_ns=1_000 + i)
        for i in range(count)
    ]
    for pod in pods:
        fake_api.put_object(pod)
    assert plugin.pod_cache is not None
    assert plugin.pod_cache.wait_for(lambda views: len(views) == count, 5)
    order = list(range(count))
    random.Random(7).shuffle(order)
    assert order != sorted(order)

    admitted = [admit(kubelet, pods[i]) for i in order]
    wait_reconciled(plugin, [p["metadata"]["name"] for p in pods])

    per_gpu = {GPU0: 0, GPU1: 0}
    corrected = 0
    for each in admitted:
        truth = assert_views_agree(fake_api, agent, each)
        (gpu,) = truth["main"]
        per_gpu[gpu] += 1
        proposed = next(p for p in pods if p["metadata"]["name"] == each.name)
        corrected += proposed["metadata"]["annotations"][names.ANNOTATION_ASSIGNED_GPUS] != gpu
    assert sum(per_gpu.values()) == count
    assert corrected > 0, "out-of-order admission must have put some pod off its proposal"
    registry = plugin.metrics.registry
    reconciled = registry.get_sample_value(
        "baton_deviceplugin_reconciled_pods_total", {"outcome": "corrected"}
    )
    assert reconciled == corrected


def test_pod_with_several_gpu_containers_and_a_gpu_init_container(
    fake_api: FakeApiServer, plugin: Daemon, kubelet: KubeletStub, agent: AgentRunner
) -> None:
    fake_api.put_object(tenant_pod("busy", (GPU0,), assigned_at_ns=1, containers={"m": 3}))
    busy = admit(kubelet, tenant_pod("busy", containers={"m": 3}))
    pod = tenant_pod(
        "multi",
        (GPU0, GPU1),
        assigned_at_ns=2,
        containers={"learner": 2, "actor": 1, "logger": 0},
        inits={"warmup": 1},
    )
    fake_api.put_object(pod)
    assert plugin.pod_cache is not None
    assert plugin.pod_cache.wait_for(lambda views: len(views) == 2, 5)

    admitted = admit(kubelet, pod)
    wait_reconciled(plugin, ["busy", "multi"])

    assert set(admitted.devices) == {"warmup", "learner", "actor"}
    assert admitted.devices["warmup"][0] in admitted.devices["learner"], "init slot reused"
    truth = assert_views_agree(fake_api, agent, admitted)
    assert set(truth) == {"learner", "actor"}, "the kubelet does not list ordinary init containers"
    assert len(truth["learner"]) == 2, "two slots, steered onto both proposed GPUs"
    assert_views_agree(fake_api, agent, busy)


def test_allocate_needs_no_api_server_and_annotations_follow_once_it_is_back(
    fake_api: FakeApiServer, plugin: Daemon, kubelet: KubeletStub
) -> None:
    pod = tenant_pod("tenant", (GPU1,), assigned_at_ns=5)
    fake_api.put_object(pod)
    assert plugin.pod_cache is not None
    assert plugin.pod_cache.wait_for(lambda views: len(views) == 1, 5)
    fake_api.stop()

    admitted = admit(kubelet, pod)
    assert admitted.envs["main"][names.ENV_GPUS] == GPU1, "steered by the cached proposal"

    fake_api.start()
    assert plugin.reconciler is not None
    plugin.reconciler.poke()
    wait_reconciled(plugin, ["tenant"])
    assert annotations_of(fake_api, "tenant")[names.ANNOTATION_ASSIGNED_GPUS] == GPU1


@pytest.mark.parametrize(("leaving", "lists"), [("terminating", 0), ("gone", 1)])
def test_a_pod_the_kubelet_still_lists_while_it_leaves_is_not_listed_for_every_pass(
    fake_api: FakeApiServer, plugin: Daemon, kubelet: KubeletStub, leaving: str, lists: int
) -> None:
    """The kubelet lists a pod's devices until its containers are gone: a pod being deleted
    (its grace period can be minutes) made every pass list the node's pods, as did a pod
    deleted from the API; the watch already shows the one, and a list cannot find the other."""
    pod = tenant_pod("leaving", (GPU1,), assigned_at_ns=5)
    fake_api.put_object(pod)
    assert plugin.pod_cache is not None and plugin.reconciler is not None
    assert plugin.pod_cache.wait_for(lambda views: len(views) == 1, 5)
    admit(kubelet, pod)
    wait_reconciled(plugin, ["leaving"])
    if leaving == "gone":
        fake_api.remove_object("Pod", "leaving")
        assert plugin.pod_cache.wait_for(lambda views: not views, 5)
    else:
        obj = fake_api.get_object("Pod", "leaving")
        assert obj is not None
        obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        fake_api.put_object(obj)
        assert plugin.pod_cache.wait_for(lambda views: all(v.deleting for v in views), 5)
    fake_api.clear_requests()

    for _ in range(4):
        assert plugin.reconciler.settle(10)

    assert len(fake_api.requests("list", "pods")) <= lists, "one list at most, not one a pass"

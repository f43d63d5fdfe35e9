"""Allocate against the fake API server through the real kubernetes client, via the kubelet stub."""

from __future__ import annotations

import json
import logging

import grpc
import pytest

from baton._pb import api_pb2
from baton.contract import names
from baton.contract.names import fake_gpu_uuid
from deviceplugin import podcache
from tests.deviceplugin.conftest import NODE, admit, tenant_pod

GPU0, GPU1 = fake_gpu_uuid(0, NODE), fake_gpu_uuid(1, NODE)
GPU = names.RESOURCE_GPU


def pod_annotations(fake_api, name):
    pod = fake_api.get_object("Pod", name)
    return pod["metadata"].get("annotations") or {}


def sample(daemon, name, **labels):
    return daemon.metrics.registry.get_sample_value(f"baton_deviceplugin_{name}", labels)


def on_gpu(devices, gpu):
    return all(names.gpu_of_device_id(d) == gpu for d in devices)


@pytest.fixture
def plugin(kubelet, start_plugin, fake_api, api_client):
    daemon = start_plugin(api_client=api_client)
    kubelet.wait_for_registrations(1)
    kubelet.wait_for_list(GPU, lambda devs: bool(devs))
    return daemon


def wait_allocated(daemon, names_):
    done = lambda pods: set(names_) <= {p.name for p in pods if p.allocated}  # noqa: E731
    assert daemon.pod_cache.wait_for(done, 10), "not reconciled in time"
    assert daemon.reconciler.settle(10), "no reconciliation pass finished"


def test_two_assigned_pods_admitted_back_to_back_each_get_their_gpu(
    fake_api, api_client, kubelet, start_plugin
):
    second = tenant_pod("second", (GPU0,), assigned_at_ns=2_000)
    first = tenant_pod("first", (GPU1,), assigned_at_ns=1_000)
    fake_api.put_object(second)
    fake_api.put_object(first)
    daemon = start_plugin(api_client=api_client)
    kubelet.wait_for_registrations(1)
    kubelet.wait_for_list(GPU, lambda devs: bool(devs))
    assert daemon.pod_cache.wait_for(lambda pods: len(pods) == 2, 5)

    pod_a, pod_b = admit(kubelet, first), admit(kubelet, second)

    assert pod_a.envs["main"][names.ENV_NVIDIA_VISIBLE_DEVICES] == GPU1
    assert pod_a.envs["main"][names.ENV_GPUS] == GPU1
    assert pod_b.envs["main"][names.ENV_NVIDIA_VISIBLE_DEVICES] == GPU0
    assert on_gpu(pod_a.devices["main"], GPU1) and on_gpu(pod_b.devices["main"], GPU0)
    assert pod_a.envs["main"][names.ENV_AGENT_SOCKET] == names.AGENT_SOCKET
    wait_allocated(daemon, ["first", "second"])
    assert pod_annotations(fake_api, "first")[names.ANNOTATION_CONTAINER_GPUS] == (
        json.dumps({"main": [GPU1]}, separators=(",", ":"))
    )
    assert sample(daemon, "allocations_total", outcome="ok") == 2
    assert sample(daemon, "reconciled_pods_total", outcome="confirmed") == 2


def test_allocate_mounts_the_agent_socket(plugin, kubelet):
    _, response = kubelet.admit(GPU, 1)
    mount = response.mounts[0]
    assert (mount.container_path, mount.host_path) == (names.AGENT_SOCKET_DIR,) * 2


def test_unassigned_pod_gets_least_loaded_gpu_and_is_annotated(fake_api, plugin, kubelet):
    busy = tenant_pod("busy", (GPU0,), assigned_at_ns=1)
    busy["metadata"]["annotations"][names.ANNOTATION_ALLOCATED_AT] = "2026-01-01T00:00:00Z"
    busy["status"]["phase"] = "Running"
    fake_api.put_object(busy)
    stray = tenant_pod("stray")
    fake_api.put_object(stray)
    assert plugin.pod_cache.wait_for(lambda pods: len(pods) == 2, 5)

    admitted = admit(kubelet, stray)

    assert admitted.envs["main"][names.ENV_GPUS] == GPU1
    assert on_gpu(admitted.devices["main"], GPU1)
    wait_allocated(plugin, ["stray"])
    found = pod_annotations(fake_api, "stray")
    assert found[names.ANNOTATION_ASSIGNED_GPUS] == GPU1
    assert names.ANNOTATION_ASSIGNED_AT in found and names.ANNOTATION_ALLOCATED_AT in found
    assert sample(plugin, "fallback_assignments_total") == 1


def test_node_annotations_follow_health(fake_api, plugin):
    from tests.deviceplugin.test_kubelet_flow import post

    def gpus(node):
        value = (node or {}).get("metadata", {}).get("annotations", {}).get(names.ANNOTATION_GPUS)
        return json.loads(value) if value else None

    node = fake_api.wait_for_object("Node", NODE, lambda n: gpus(n) is not None, namespace="")
    assert [(g["uuid"], g["slots"], g["healthy"]) for g in gpus(node)] == [
        (GPU0, 4, True),
        (GPU1, 4, True),
    ]
    assert node["metadata"]["annotations"][names.ANNOTATION_HOST_MEMORY_BUDGET] == "4096"
    post(plugin, "/fake/xid", {"gpu": GPU0, "xid": 79})
    fake_api.wait_for_object(
        "Node", NODE, lambda n: [g["healthy"] for g in gpus(n)] == [False, True], namespace=""
    )


def test_allocate_of_device_ids_not_of_ours_is_a_clear_refusal(plugin, kubelet):
    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["not-a-slot"])]
    )
    with pytest.raises(grpc.RpcError) as failure:
        kubelet.endpoint(GPU).stub.Allocate(request, timeout=5)
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "<GPU-UUID>::<slot>" in failure.value.details()
    assert sample(plugin, "allocations_total", outcome="bad-request") == 1


def test_allocate_of_a_gpu_this_node_lacks_is_refused_naming_the_device(plugin, kubelet):
    foreign = names.slot_device_id(fake_gpu_uuid(0, "node-b"), 0)
    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[foreign])]
    )
    with pytest.raises(grpc.RpcError) as failure:
        kubelet.endpoint(GPU).stub.Allocate(request, timeout=5)
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"devices {foreign} are not advertised on node {NODE}" in failure.value.details()
    assert sample(plugin, "allocations_total", outcome="bad-request") == 1


@pytest.mark.parametrize(
    "stale",
    [fake_gpu_uuid(0, "node-b"), f"{GPU1} {GPU0}", "[not a uuid"],
    ids=["another-nodes-gpu", "space-separated", "garbage"],
)
def test_an_older_assignment_naming_no_gpu_here_does_not_steer_the_next_pod_away(
    fake_api, api_client, kubelet, start_plugin, stale
):
    """A pod whose assigned-gpus names no GPU of this node (another node's, malformed) was the
    oldest assigned pod, so the next admission was steered for it, onto no GPU in particular:
    the pod the extender had placed on GPU1 got GPU0."""
    fake_api.put_object(tenant_pod("stale", (stale,), assigned_at_ns=1_000))
    fake_api.put_object(tenant_pod("placed", (GPU1,), assigned_at_ns=2_000))
    daemon = start_plugin(api_client=api_client)
    kubelet.wait_for_registrations(1)
    kubelet.wait_for_list(GPU, bool)
    assert daemon.pod_cache.wait_for(lambda pods: len(pods) == 2, 5)

    placed = admit(kubelet, tenant_pod("placed", (GPU1,)))

    assert placed.envs["main"][names.ENV_GPUS] == GPU1
    assert on_gpu(placed.devices["main"], GPU1)


def test_a_container_whose_assigned_gpu_failed_still_gets_as_many_gpus_as_it_asked(
    fake_api, api_client, kubelet, start_plugin
):
    from tests.deviceplugin.test_kubelet_flow import post

    gpu2 = fake_gpu_uuid(2, NODE)
    pod = tenant_pod("two", (GPU0, GPU1), assigned_at_ns=1_000, request=2)
    fake_api.put_object(pod)
    daemon = start_plugin(api_client=api_client, gpus="3x81920")
    kubelet.wait_for_registrations(1)
    assert daemon.pod_cache.wait_for(lambda pods: len(pods) == 1, 5)
    post(daemon, "/fake/xid", {"gpu": GPU0, "xid": 79})  # between the bind and the admission
    kubelet.wait_for_list(GPU, lambda devs: devs[names.slot_device_id(GPU0, 0)] == "Unhealthy")

    admitted = admit(kubelet, pod)

    gpus = admitted.envs["main"][names.ENV_GPUS].split(",")
    assert sorted(gpus) == sorted([GPU1, gpu2]), f"asked 2 GPUs, got {gpus}"


def test_an_api_server_that_does_not_answer_delays_one_admission_not_each(
    fake_api, api_client, kubelet, start_plugin, monkeypatch
):
    """Pods scheduled without the extender are steered after one list of the node's pods; with
    the API server not answering, each GetPreferredAllocation waited for that list's timeout
    (5 s), and the kubelet admits one container after another: N pods waited 5N s."""
    monkeypatch.setattr(podcache, "REQUEST_TIMEOUT_S", 1.0)  # the list's timeout, shortened
    strays = [tenant_pod(f"stray-{i}") for i in range(3)]
    for stray in strays:
        fake_api.put_object(stray)
    daemon = start_plugin(api_client=api_client)
    kubelet.wait_for_registrations(1)
    kubelet.wait_for_list(GPU, lambda devs: bool(devs))
    assert daemon.pod_cache.wait_for(lambda pods: len(pods) == 3, 5)
    fake_api.clear_requests()
    fake_api.hang_next("list", "pods", times=len(strays))
    try:
        for stray in strays:
            admitted = admit(kubelet, stray)
            assert len(admitted.devices["main"]) == 1
    finally:
        fake_api.release_hangs()
    assert len(fake_api.requests("list", "pods")) == 1, "one list timed out; the rest waited none"


def test_a_pod_watch_outage_says_truly_what_goes_on_meanwhile(
    fake_api, api_client, kubelet, start_plugin, monkeypatch, caplog
):
    """With the node's pods unlistable, the plugin's warnings said that Allocate lists them
    itself and fails naming the API server: since the pod cache Allocate needs no pods, and a
    container is still admitted, steered by what was seen last."""
    from deviceplugin import daemon as daemon_module

    caplog.set_level(logging.WARNING)
    monkeypatch.setattr(daemon_module, "SYNC_TIMEOUT_S", 0.5)
    fake_api.fail_next("list", "pods", 503, times=1000)
    daemon = start_plugin(api_client=api_client)
    kubelet.wait_for_registrations(1)
    kubelet.wait_for_list(GPU, lambda devs: bool(devs))
    admitted = admit(kubelet, tenant_pod("during"))
    assert len(admitted.devices["main"]) == 1
    said = [r.getMessage() for r in caplog.records if r.name.startswith("deviceplugin")]
    outage = [line for line in said if line.startswith(f"pod watch of node {NODE}:")]
    unsynced = [line for line in said if "not listed within" in line]
    assert outage and unsynced, said
    for line in (outage[0], unsynced[0]):
        assert "Allocate lists" not in line and "Allocate still answers" in line, line
    assert not daemon.pod_cache.wait_synced(0)

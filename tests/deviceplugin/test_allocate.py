"""Allocate against the fake API server through the real kubernetes client, via the kubelet stub."""

from __future__ import annotations

import json

import pytest

from baton import names
from baton.names import fake_gpu_uuid
from tests.deviceplugin.conftest import NODE, tenant_pod
from tests.harness.kubelet import AdmissionError

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


def test_two_assigned_pods_admitted_back_to_back_each_get_their_gpu(
    fake_api, api_client, kubelet, start_plugin
):
    fake_api.put_object(tenant_pod("second", (GPU0,), assigned_at_ns=2_000))
    fake_api.put_object(tenant_pod("first", (GPU1,), assigned_at_ns=1_000))
    daemon = start_plugin(api_client=api_client)
    kubelet.wait_for_registrations(1)
    kubelet.wait_for_list(GPU, lambda devs: bool(devs))
    fake_api.clear_requests()

    devices_a, response_a = kubelet.admit(GPU, 1)
    devices_b, response_b = kubelet.admit(GPU, 1)

    assert response_a.envs[names.ENV_NVIDIA_VISIBLE_DEVICES] == GPU1
    assert response_a.envs[names.ENV_GPUS] == GPU1
    assert response_b.envs[names.ENV_NVIDIA_VISIBLE_DEVICES] == GPU0
    assert on_gpu(devices_a, GPU1) and on_gpu(devices_b, GPU0), "preferred slots follow the pod"
    assert response_a.envs[names.ENV_AGENT_SOCKET] == names.AGENT_SOCKET
    mount = response_a.mounts[0]
    assert (mount.container_path, mount.host_path) == (names.AGENT_SOCKET_DIR,) * 2
    assert names.ANNOTATION_ALLOCATED_AT in pod_annotations(fake_api, "first")
    assert names.ANNOTATION_ALLOCATED_AT in pod_annotations(fake_api, "second")
    # the pod lookup came from the watch-fed cache: two patches, not a single list
    assert [r.verb for r in fake_api.requests(resource="pods") if r.verb != "watch"] == [
        "patch",
        "patch",
    ]
    assert sample(daemon, "allocations_total", outcome="ok") == 2


def test_unassigned_pod_gets_least_loaded_gpu_and_is_annotated(fake_api, plugin, kubelet):
    busy = tenant_pod("busy", (GPU0,), assigned_at_ns=1)
    busy["metadata"]["annotations"][names.ANNOTATION_ALLOCATED_AT] = "2026-01-01T00:00:00Z"
    busy["status"]["phase"] = "Running"
    fake_api.put_object(busy)
    fake_api.put_object(tenant_pod("stray"))
    assert plugin.pod_cache.wait_for(lambda pods: len(pods) == 2, 5)

    devices, response = kubelet.admit(GPU, 1)

    assert response.envs[names.ENV_GPUS] == GPU1
    assert on_gpu(devices, GPU1)
    stray = pod_annotations(fake_api, "stray")
    assert stray[names.ANNOTATION_ASSIGNED_GPUS] == GPU1
    assert names.ANNOTATION_ASSIGNED_AT in stray and names.ANNOTATION_ALLOCATED_AT in stray
    assert sample(plugin, "fallback_assignments_total") == 1


def test_api_server_down_fails_admission_with_the_cause_then_recovers(fake_api, plugin, kubelet):
    fake_api.put_object(tenant_pod("tenant", (GPU1,), assigned_at_ns=5))
    assert plugin.pod_cache.wait_for(lambda pods: len(pods) == 1, 5)
    fake_api.stop()

    with pytest.raises(AdmissionError) as failure:
        kubelet.admit(GPU, 1)
    message = str(failure.value)
    assert "UNAVAILABLE" in message and f"Kubernetes API server at {fake_api.url}" in message
    assert "unreachable (Connection refused)" in message, message
    assert sample(plugin, "allocations_total", outcome="api-unavailable") == 1

    fake_api.start()
    _, response = kubelet.admit(GPU, 1)
    assert response.envs[names.ENV_GPUS] == GPU1
    assert names.ANNOTATION_ALLOCATED_AT in pod_annotations(fake_api, "tenant")


def test_no_waiting_pod_is_a_clear_refusal(plugin, kubelet):
    with pytest.raises(AdmissionError, match=r"no pod on node node-a waits for 1 baton\.dev/gpu"):
        kubelet.admit(GPU, 1)


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

"""The extender, the device plugin and the agent read the same pod the same way."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from agent.core.planner import TenantView
from agent.node.podwatch import pod_tenant
from baton.contract import names
from baton.contract.podask import parse_pod_request
from deviceplugin.podcache import pod_view
from extender.inventory import node_inventory
from extender.placement import place
from extender.snapshot import Limits, node_state
from tests.extender.builders import node

GIB = 2**30


def _container(name: str, resources: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "img", "resources": resources, **extra}


def _pod(containers: list[dict[str, Any]], init: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "p",
            "namespace": "team",
            "uid": "u1",
            "annotations": {names.ANNOTATION_ASSIGNED_GPUS: "GPU-n-0"},
        },
        "spec": {"nodeName": "n", "containers": containers, "initContainers": list(init)},
        "status": {"phase": "Running"},
    }


def _trainer(**limits: str) -> dict[str, Any]:
    asks = {names.RESOURCE_GPU: "1", names.RESOURCE_GPU_MEMORY: "20480"}
    return _container("main", {"limits": {**asks, **limits}})


SIDECAR = {"limits": {"memory": "1Gi", "cpu": "100m"}}


@pytest.mark.parametrize(
    "pod",
    [
        _pod([_trainer(), _container("log-shipper", SIDECAR)]),
        _pod([_trainer()], init=[_container("proxy", SIDECAR, restartPolicy="Always")]),
    ],
    ids=["sidecar-container", "native-sidecar"],
)
def test_a_gpu_container_without_a_memory_limit_is_parkable_everywhere(
    pod: dict[str, Any],
) -> None:
    request = parse_pod_request(pod)
    assert request is not None and request.memory_limit_bytes is None
    inventory = node_inventory(node("n", gpus=1))
    state = node_state("n", inventory.gpus, inventory.budget_mib, {}, Limits())
    assert place(state, request, Limits()).fits
    tenant = pod_tenant(pod)
    assert tenant is not None and tenant.memory_limit_bytes == 0  # 0: no limit
    view = TenantView(
        tenant.tenant_id,
        {"GPU-n-0": 20480 * 2**20},
        memory_limit=tenant.memory_limit_bytes or None,
    )
    assert not view.cgroup_blocks_park()


def test_the_memory_limit_that_bounds_parking_is_the_gpu_containers() -> None:
    pod = _pod([_trainer(memory="64Gi"), _container("log-shipper", SIDECAR)])
    request = parse_pod_request(pod)
    tenant = pod_tenant(pod)
    assert request is not None and request.memory_limit_bytes == 64 * GIB
    assert tenant is not None and tenant.memory_limit_bytes == 64 * GIB


def test_a_two_container_pods_duty_is_summed_everywhere() -> None:
    asks = {names.RESOURCE_GPU: "1", names.RESOURCE_GPU_DUTY: "30"}
    pod = _pod(
        [
            _container("actor", {"limits": dict(asks)}),
            _container("learner", {"limits": {**asks, names.RESOURCE_GPU_DUTY: "40"}}),
        ]
    )
    request = parse_pod_request(pod)
    tenant = pod_tenant(pod)
    assert request is not None and request.duty == 70.0
    assert tenant is not None and tenant.gpu_duty == 70
    view = pod_view(pod)
    assert (view.gpu_request, view.slot_asks) == (request.gpus, (1, 1))


def test_a_sidecar_asking_for_a_gpu_adds_to_the_pods_slots_everywhere() -> None:
    asks = {names.RESOURCE_GPU: "1"}
    sidecar = _container("reward", {"limits": asks}, restartPolicy="Always")
    warmup = _container("warmup", {"limits": {names.RESOURCE_GPU: "1"}})
    pod = _pod([_container("main", {"limits": dict(asks)})], init=[sidecar, warmup])
    request = parse_pod_request(pod)
    view = pod_view(pod)
    assert request is not None and request.gpus == 2  # main and reward run together
    assert (view.gpu_request, view.slot_asks) == (2, (1, 1, 1))

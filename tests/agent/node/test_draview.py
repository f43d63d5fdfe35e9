"""The agent on the DRA path: a pod's GPUs, memory and duty come from its claims' allocations
and the node's ResourceSlice (no device plugin or extender annotates it)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from agent.node.draview import DraView
from agent.node.podwatch import PodWatcher, pod_tenant
from agent.node.tenants import Tenant
from baton.contract import names
from baton.contract.kube import load_api_client
from tests.harness.fakeapi import FakeApiServer

NODE = "node-1"
UUIDS = {"gpu-0": "GPU-aaa", "gpu-1": "GPU-bbb"}


def claim(name: str, device: str | None, memory: str = "30Gi", duty: str = "30") -> dict[str, Any]:
    """A claim, allocated a share of `device` on NODE (None: not allocated yet)."""
    status: dict[str, Any] = {}
    if device:
        result = {
            "request": "gpu",
            "driver": names.DRA_DRIVER,
            "pool": NODE,
            "device": device,
            "shareID": "share-1",
            "consumedCapacity": {"memory": memory, "duty": duty, "slots": "1"},
        }
        status = {"allocation": {"devices": {"results": [result]}}}
    return {"metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}"}, "status": status}


def claim_pod(name: str, uid: str, claim_name: str) -> dict[str, Any]:
    """A pod whose container `trainer` uses the claim generated from a template."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team", "uid": uid},
        "spec": {
            "nodeName": NODE,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "share-30g"}],
            "containers": [
                {"name": "trainer", "image": "t", "resources": {"claims": [{"name": "gpu"}]}},
                {"name": "sidecar", "image": "s"},
            ],
        },
        "status": {
            "phase": "Running",
            "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim_name}],
        },
    }


class Claims:
    """Claims and the slice in memory; counts reads; fails while `failing` is set."""

    def __init__(self, *claims: dict[str, Any]) -> None:
        self.claims = {c["metadata"]["name"]: c for c in claims}
        self.reads = 0
        self.failing = False

    def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads += 1
        if self.failing:
            raise OSError("connection refused")
        return self.claims.get(name)

    def list_slices(self) -> list[dict[str, Any]]:
        devices = [
            {"name": d, "attributes": {names.DRA_ATTRIBUTE_UUID: {"string": u}}}
            for d, u in UUIDS.items()
        ]
        return [{"spec": {"driver": names.DRA_DRIVER, "nodeName": NODE, "devices": devices}}]


def test_a_claim_pods_tenant_has_its_gpu_memory_and_duty_per_container() -> None:
    view = DraView(Claims(claim("c1", "gpu-1")), NODE)
    pod = claim_pod("trainer", "pod-1", "c1")
    tenant = pod_tenant(pod, view.holding(pod))
    assert tenant is not None
    assert tenant.gpus == ("GPU-bbb",)
    assert tenant.container_gpus == {"trainer": ("GPU-bbb",)}, "the sidecar holds no GPU"
    assert (tenant.gpu_memory_mib, tenant.gpu_duty) == (30 * 1024, 30)


def test_the_claim_generated_for_a_plain_gpu_limit_is_read_too() -> None:
    pod = claim_pod("plain", "pod-2", "unused")
    del pod["spec"]["resourceClaims"]
    pod["spec"]["containers"][0]["resources"] = {"limits": {names.RESOURCE_GPU: "1"}}
    pod["status"] = {
        "phase": "Running",
        "extendedResourceClaimStatus": {
            "resourceClaimName": "plain-extended-resources-x",
            "requestMappings": [
                {"containerName": "trainer", "resourceName": names.RESOURCE_GPU, "requestName": "r"}
            ],
        },
    }
    view = DraView(Claims(claim("plain-extended-resources-x", "gpu-0", "80Gi", "25")), NODE)
    tenant = pod_tenant(pod, view.holding(pod))
    assert tenant is not None and tenant.container_gpus == {"trainer": ("GPU-aaa",)}
    assert (tenant.gpu_memory_mib, tenant.gpu_duty) == (80 * 1024, 25)


def test_read_again_until_allocated_then_remembered_and_forgotten_with_the_pod() -> None:
    claims = Claims(claim("c1", None))
    view = DraView(claims, NODE)
    pod = claim_pod("trainer", "pod-1", "c1")
    assert view.holding(pod) is None
    claims.claims["c1"] = claim("c1", "gpu-0")
    held = view.holding(pod)
    assert held is not None and held.container_gpus == {"trainer": ("GPU-aaa",)}
    reads = claims.reads
    assert view.holding(pod) == held and claims.reads == reads, "an allocation is read once"
    view.forget("pod-1")
    assert view.holding(pod) == held and claims.reads == reads + 1


def test_an_api_failure_answers_none_and_the_next_change_reads_again() -> None:
    claims = Claims(claim("c1", "gpu-0"))
    claims.failing = True
    view = DraView(claims, NODE)
    pod = claim_pod("trainer", "pod-1", "c1")
    assert view.holding(pod) is None
    claims.failing = False
    assert view.holding(pod) is not None


def test_claims_of_other_drivers_or_nodes_are_no_tenant() -> None:
    other = claim("c1", "gpu-0")
    other["status"]["allocation"]["devices"]["results"][0]["driver"] = "gpu.nvidia.com"
    elsewhere = claim("c2", "gpu-0")
    elsewhere["status"]["allocation"]["devices"]["results"][0]["pool"] = "node-2"
    view = DraView(Claims(other, elsewhere), NODE)
    for uid, name in (("pod-1", "c1"), ("pod-2", "c2")):
        pod = claim_pod("p", uid, name)
        assert pod_tenant(pod, view.holding(pod)) is None


def test_the_pod_watch_makes_claim_pods_tenants(tmp_path: Path) -> None:
    loop = asyncio.new_event_loop()
    joined: list[Tenant] = []
    with FakeApiServer() as api:
        api.put_object(claim_pod("trainer", "pod-1", "c1"))
        watcher = PodWatcher(
            load_api_client(str(api.kubeconfig_path(tmp_path))),
            NODE,
            loop,
            joined.append,
            lambda tenant_id: None,
            dra=DraView(Claims(claim("c1", "gpu-1")), NODE),
        )
        try:
            watcher.start()
            api.wait_for_requests("watch", "pods")
        finally:
            watcher.stop()
            loop.call_soon(loop.stop)
            loop.run_forever()
            loop.close()
    assert [(t.tenant_id, t.container_gpus) for t in joined] == [
        ("team/trainer", {"trainer": ("GPU-bbb",)})
    ]


class Denied(Exception):
    status = 403


def test_without_the_right_to_read_claims_the_pod_is_no_tenant_and_not_read_again() -> None:
    claims = Claims(claim("c1", "gpu-0"))
    view = DraView(claims, NODE)

    def denied(namespace: str, name: str) -> dict[str, Any] | None:
        claims.reads += 1
        raise Denied("forbidden")

    claims.read_claim = denied  # type: ignore[method-assign]
    pod = claim_pod("trainer", "pod-1", "c1")
    assert view.holding(pod) is None and view.holding(pod) is None
    assert claims.reads == 1

"""The schedule bench's DRA side: each node's ResourceSlice, the DeviceClass, and claim pods.

Nodes have no kubelet and no driver: their slices are created through the API exactly as
`baton dra` publishes them (`dra.slices`), and kube-scheduler allocates claims from what it
reads there. Each tenant pod names a ResourceClaim of its own, made beforehand, asking for the
same memory and duty as the extender path's pod of the same index.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from baton.contract import names
from commands.bench import fleet
from dra.slices import resource_slice
from nodegpu.inventory import Inventory, NodeGpu

GROUP = "resource.k8s.io"
VERSION = "v1"
DEVICE_CLASS = (
    Path(__file__).resolve().parents[2]
    / "manifests"
    / "overlays"
    / "dra"
    / "driver"
    / "deviceclass.yaml"
)


def node_slice(node_name: str) -> dict[str, Any]:
    """The slice `baton dra` would publish for a bench node: its 8 GPUs of 80 GiB, 4 slots."""
    gpus = tuple(
        NodeGpu(f"GPU-{node_name}-{index}", index, fleet.GPU_MODEL, fleet.GPU_MIB)
        for index in range(fleet.GPUS_PER_NODE)
    )
    return resource_slice(node_name, Inventory(gpus, fleet.SLOTS_PER_GPU), generation=1)


def make_slices(custom: Any, node_names: Iterable[str], workers: int = 8) -> None:
    """The project's DeviceClass and one slice per node, through the API (`CustomObjectsApi`).

    The class goes without its `extendedResourceName`: the same nodes serve the extender
    path's pods, and with the mapping kube-scheduler refuses those ("cannot fit resource").
    The bench's claims name the class, so they do not need it.
    """
    device_class = yaml.safe_load(DEVICE_CLASS.read_text())
    device_class["spec"].pop("extendedResourceName", None)
    custom.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", device_class)

    def one(name: str) -> None:
        custom.create_cluster_custom_object(GROUP, VERSION, "resourceslices", node_slice(name))

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, node_names))


def claim_body(name: str, scheduler: str, memory_mib: int, duty: int) -> dict[str, Any]:
    """A claim for one share of a Baton GPU: `memory_mib` of its memory and `duty`."""
    requests = {names.DRA_CAPACITY_MEMORY: f"{memory_mib}Mi", names.DRA_CAPACITY_DUTY: str(duty)}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "labels": {fleet.BENCH_LABEL: scheduler}},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": names.DRA_DEVICE_CLASS,
                            "capacity": {"requests": requests},
                        },
                    }
                ]
            }
        },
    }


def pod_body(name: str, scheduler: str, claim_name: str) -> dict[str, Any]:
    """A tenant pod whose one container uses the claim `claim_name`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {fleet.BENCH_LABEL: scheduler}},
        "spec": {
            "schedulerName": scheduler,
            "automountServiceAccountToken": False,
            "nodeSelector": {fleet.BENCH_LABEL: "true"},
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
            "containers": [
                {
                    "name": "tenant",
                    "image": "baton:bench",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def create_claims(
    custom: Any, namespace: str, bodies: Iterable[dict[str, Any]], workers: int = 8
) -> None:
    """Create the claims (before their pods, so every pod's claim is there when it is seen)."""

    def one(body: dict[str, Any]) -> None:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims", body)

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, bodies))


def delete_claims(custom: Any, namespace: str, scheduler: str, workers: int = 8) -> None:
    """Remove a profile's claims, allocated ones included.

    The scheduler puts a delete-protection finalizer on each claim it allocates, which only
    kube-controller-manager's claim controller would lift: there is none here, so the bench
    lifts it once the pods are gone.
    """
    selector = f"{fleet.BENCH_LABEL}={scheduler}"
    custom.delete_collection_namespaced_custom_object(
        GROUP, VERSION, namespace, "resourceclaims", label_selector=selector
    )
    held = custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, "resourceclaims", label_selector=selector
    )["items"]

    def release(claim: dict[str, Any]) -> None:
        unfinalized = {"metadata": {"finalizers": None}}  # a merge patch: null removes
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "resourceclaims", claim["metadata"]["name"], unfinalized
        )

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(release, [c for c in held if c["metadata"].get("finalizers")]))

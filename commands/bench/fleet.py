"""Nodes without kubelets and tenant pods, made through a real API server (as kwok does).

A node is created with Baton's annotations, then its status is patched to carry the device
plugin's `baton.dev/gpu` capacity and a Ready condition, and the `not-ready` taint that the API
server puts on every new node is lifted: nothing else would, there is no kubelet.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from baton.contract.annotations import GpuRecord, node_annotations
from baton.contract.kube import Outage
from baton.contract.names import (
    LABEL_BENCH,
    LABEL_GPU_NODE,
    RESOURCE_GPU,
    RESOURCE_GPU_DUTY,
    RESOURCE_GPU_MEMORY,
)
from baton.contract.reflector import KubeSource, Reflector, WatchEvent

log = logging.getLogger(__name__)

GPUS_PER_NODE = 8
SLOTS_PER_GPU = 4
GPU_MIB = 81920
GPU_MODEL = "NVIDIA H100 80GB HBM3"
BENCH_LABEL = LABEL_BENCH
LIST_TIMEOUT_S = 30.0


def node_body(name: str) -> dict[str, Any]:
    """A node as the device plugin would annotate it: 8 GPUs of 80 GiB, 4 slots each."""
    gpus = [
        GpuRecord(f"GPU-{name}-{index}", index, GPU_MODEL, GPU_MIB, SLOTS_PER_GPU)
        for index in range(GPUS_PER_NODE)
    ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {BENCH_LABEL: "true", LABEL_GPU_NODE: "true"},
            "annotations": node_annotations(gpus, budget_mib=4 * 1024 * 1024),
        },
    }


def node_status() -> dict[str, Any]:
    """Capacity (the device plugin's slots included) and a Ready condition."""
    capacity = {
        "cpu": "192",
        "memory": "2Ti",
        "pods": "110",
        RESOURCE_GPU: str(GPUS_PER_NODE * SLOTS_PER_GPU),
    }
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "a node of the schedule bench (no kubelet)",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    return {"status": {"capacity": capacity, "allocatable": capacity, "conditions": [ready]}}


def make_nodes(api: Any, names: Iterable[str], workers: int = 8) -> None:
    """Create the nodes, give them capacity and lift their `not-ready` taint."""

    def one(name: str) -> None:
        api.create_node(node_body(name))
        api.patch_node_status(name, node_status())
        api.patch_node(name, {"spec": {"taints": []}})

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, names))


def pod_body(name: str, scheduler: str, memory_mib: int, duty: int) -> dict[str, Any]:
    """A tenant pod asking for one Baton GPU slot, device memory and duty."""
    limits = {
        RESOURCE_GPU: "1",
        RESOURCE_GPU_MEMORY: str(memory_mib),
        RESOURCE_GPU_DUTY: str(duty),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {BENCH_LABEL: scheduler}},
        "spec": {
            "schedulerName": scheduler,
            "automountServiceAccountToken": False,
            "nodeSelector": {BENCH_LABEL: "true"},
            "containers": [
                {"name": "tenant", "image": "baton:bench", "resources": {"limits": limits}}
            ],
        },
    }


def make_namespace(api: Any, namespace: str) -> None:
    """The bench's namespace and its `default` ServiceAccount (no controller makes one here)."""
    api.create_namespace({"metadata": {"name": namespace}})
    api.create_namespaced_service_account(namespace, {"metadata": {"name": "default"}})


class BindWatch:
    """Records when each pod of a namespace was first seen bound to a node.

    A reflector (`baton.contract.reflector`) reads the watch as raw JSON lines with orjson, as
    the extender's do, and this store looks at three fields of each pod: it shares the machine
    with the schedulers it measures, and building the client's model objects for every event
    would take CPU from them.
    """

    def __init__(self, api: Any, namespace: str) -> None:
        """`api` is a `CoreV1Api`; the watch runs on a client of its own made from its config."""
        self._lock = threading.Condition()
        self.bound: dict[str, float] = {}
        self._listed = threading.Event()
        outage = Outage(log, f"the bench's pod watch in {namespace}", "bind times wait for it")
        source = KubeSource(api.api_client, "pods", namespace=namespace)
        self._reflector = Reflector(source, self, outage, name="bind-watch")

    def start(self) -> BindWatch:
        """Start watching; returns once the first list is taken (later pods are all seen)."""
        self._reflector.start()
        if not self._listed.wait(LIST_TIMEOUT_S):
            self._reflector.stop()
            raise TimeoutError(f"the bench's pod watch did not list in {LIST_TIMEOUT_S} s")
        return self

    def replace(self, objects: list[dict[str, Any]], resource_version: str) -> None:
        for pod in objects:
            self._saw(pod)
        self._listed.set()

    def apply(self, event: WatchEvent) -> None:
        if event.type != "DELETED":
            self._saw(event.object)

    def _saw(self, pod: dict[str, Any]) -> None:
        if (pod.get("spec") or {}).get("nodeName"):
            with self._lock:
                self.bound.setdefault(pod["metadata"]["name"], time.monotonic())
                self._lock.notify_all()

    def wait_bound(self, names: Iterable[str], timeout: float) -> None:
        """Return once every pod in `names` is bound; TimeoutError saying how many were not."""
        wanted = set(names)
        with self._lock:
            if not self._lock.wait_for(lambda: wanted <= self.bound.keys(), timeout):
                missing = len(wanted - self.bound.keys())
                raise TimeoutError(f"{missing} of {len(wanted)} pods unbound after {timeout} s")

    def stop(self) -> None:
        """End the watch (and wait, bounded, for its thread)."""
        self._reflector.stop()


def create_pods(
    api: Any,
    namespace: str,
    bodies: list[dict[str, Any]],
    workers: int = 8,
    pace: Callable[[int], None] | None = None,
) -> dict[str, float]:
    """Create the pods (`pace(i)` before the i-th, if given); when each create was sent."""
    sent: dict[str, float] = {}

    def one(item: tuple[int, dict[str, Any]]) -> None:
        index, body = item
        if pace is not None:
            pace(index)
        sent[body["metadata"]["name"]] = time.monotonic()
        api.create_namespaced_pod(namespace, body)

    with ThreadPoolExecutor(workers if pace is None else 1) as pool:
        list(pool.map(one, enumerate(bodies)))
    return sent


def delete_pods(api: Any, namespace: str, scheduler: str) -> None:
    """Remove a profile's pods at once (no kubelet would ever confirm a graceful delete)."""
    api.delete_collection_namespaced_pod(
        namespace, label_selector=f"{BENCH_LABEL}={scheduler}", grace_period_seconds=0
    )

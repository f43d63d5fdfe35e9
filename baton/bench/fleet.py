"""Nodes without kubelets and tenant pods, made through a real API server (as kwok does).

A node is created with Baton's annotations, then its status is patched to carry the device
plugin's `baton.dev/gpu` capacity and a Ready condition, and the `not-ready` taint that the API
server puts on every new node is lifted: nothing else would, there is no kubelet.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from baton.contract.names import (
    ANNOTATION_GPUS,
    ANNOTATION_HOST_MEMORY_BUDGET,
    LABEL_BENCH,
    LABEL_GPU_NODE,
    RESOURCE_GPU,
    RESOURCE_GPU_DUTY,
    RESOURCE_GPU_MEMORY,
)
from extender.kubeapi import Watch

GPUS_PER_NODE = 8
SLOTS_PER_GPU = 4
GPU_MIB = 81920
GPU_MODEL = "NVIDIA H100 80GB HBM3"
BENCH_LABEL = LABEL_BENCH


def node_body(name: str) -> dict[str, Any]:
    """A node as the device plugin would annotate it: 8 GPUs of 80 GiB, 4 slots each."""
    gpus = [
        {
            "uuid": f"GPU-{name}-{index}",
            "index": index,
            "model": GPU_MODEL,
            "memoryMiB": GPU_MIB,
            "slots": SLOTS_PER_GPU,
            "healthy": True,
        }
        for index in range(GPUS_PER_NODE)
    ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {BENCH_LABEL: "true", LABEL_GPU_NODE: "true"},
            "annotations": {
                ANNOTATION_GPUS: json.dumps(gpus),
                ANNOTATION_HOST_MEMORY_BUDGET: str(4 * 1024 * 1024),
            },
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

    It reads the watch as raw JSON lines (`extender.kubeapi.Watch`, as the extender's own
    watches do) and looks at three fields of each pod: it shares the machine with the
    schedulers it measures, and building the client's model objects for every event would take
    CPU from them.
    """

    def __init__(self, api: Any, namespace: str) -> None:
        self._api = api
        self._namespace = namespace
        self._lock = threading.Condition()
        self.bound: dict[str, float] = {}
        self._thread = threading.Thread(target=self._run, name="bind-watch", daemon=True)
        self._error: BaseException | None = None
        self._stopped = threading.Event()
        self._watch: Watch | None = None
        self._version = ""

    def start(self) -> BindWatch:
        """Start watching; returns once the first list is taken (later pods are all seen)."""
        self._relist()
        self._thread.start()
        return self

    def _relist(self) -> None:
        raw = self._api.list_namespaced_pod(self._namespace, _preload_content=False)
        listed = orjson.loads(raw.data)
        for pod in listed.get("items") or []:
            self._saw(pod)
        self._version = str((listed.get("metadata") or {}).get("resourceVersion", ""))

    def _saw(self, pod: dict[str, Any]) -> None:
        if (pod.get("spec") or {}).get("nodeName"):
            with self._lock:
                self.bound.setdefault(pod["metadata"]["name"], time.monotonic())
                self._lock.notify_all()

    def _run(self) -> None:
        """Watch from the last version seen; a watch the server ends is opened again."""
        try:
            while not self._stopped.is_set():
                response = self._api.list_namespaced_pod(
                    self._namespace,
                    watch=True,
                    resource_version=self._version,
                    timeout_seconds=60,
                    _preload_content=False,
                )
                self._watch = Watch(response, "pods")
                if self._stopped.is_set():  # stop() came before this watch: end it unread
                    self._watch.close()
                    response.release_conn()
                    break
                self._follow(self._watch)
        except BaseException as exc:  # reported by wait_bound
            if not self._stopped.is_set():
                with self._lock:
                    self._error = exc
                    self._lock.notify_all()

    def _follow(self, events: Iterable[dict[str, Any]]) -> None:
        """The events of one watch, until the server or `stop()` ends it."""
        for event in events:
            pod = event.get("object") or {}
            if event.get("type") == "ERROR":
                if pod.get("code") != 410:
                    raise RuntimeError(f"the watch ended: {pod.get('message', pod)}")
                self._relist()  # the history we asked for is gone: start over from now
                return
            self._version = str(pod["metadata"]["resourceVersion"])
            self._saw(pod)

    def wait_bound(self, names: Iterable[str], timeout: float) -> None:
        """Return once every pod in `names` is bound; TimeoutError saying how many were not."""
        wanted = set(names)
        deadline = time.monotonic() + timeout

        def done() -> bool:
            return self._error is not None or wanted <= self.bound.keys()

        with self._lock:
            while not done():
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = len(wanted - self.bound.keys())
                    raise TimeoutError(f"{missing} of {len(wanted)} pods unbound after {timeout} s")
                self._lock.wait(left)
            if self._error is not None:
                raise RuntimeError(f"the pod watch failed: {self._error}") from self._error

    def stop(self) -> None:
        """End the watch (and wait, bounded, for its thread)."""
        self._stopped.set()
        if self._watch is not None:
            self._watch.close()
        self._thread.join(timeout=10)


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

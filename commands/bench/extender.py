"""`baton bench extender`: the real HTTP verbs against a large synthetic cluster.

The server runs in a child process (the extender's HTTP server on loopback, one event loop)
so the client does not share its interpreter. Requests are shaped as kube-scheduler sends them with
`nodeCacheCapable: true`: the full Pod and a list of node names. kube-scheduler stops looking
for feasible nodes after `percentageOfNodesToScore` (adaptive: 50% - nodes/125, at least 5%,
at least 100 nodes), so a filter call carries that many names, not the whole cluster.
Each filter asks with a fresh random shape, so nothing is answered from an earlier request.
Bind runs against an in-memory API (no network round trips to an API server).
"""

from __future__ import annotations

import http.client
import json
import multiprocessing
import os
import random
import socket
import threading
import time
from typing import Any

from baton.contract.annotations import GpuRecord, gpu_fields
from baton.contract.names import (
    ANNOTATION_ASSIGNED_GPUS,
    ANNOTATION_GPUS,
    ANNOTATION_HOST_MEMORY_BUDGET,
    RESOURCE_GPU,
    RESOURCE_GPU_DUTY,
    RESOURCE_GPU_MEMORY,
    SCHEDULER_NAME,
)
from baton.contract.podask import parse_pod_request
from extender.bind import Binder
from extender.cache import KINDS, ClusterCache
from extender.errors import ApiFailure
from extender.placement import Limits, place
from extender.server import bind_socket
from extender.state import ClusterState

GPUS_PER_NODE = 8
GPU_MIB = 81920
GPU_MODEL = "NVIDIA H100 80GB HBM3"
MEMORY_SHAPES = (None, 8192, 16384, 24576, 40960)
DUTY_SHAPES = (None, 10, 20, 25, 30, 50)


def nodes_to_score(nodes: int) -> int:
    """How many feasible nodes kube-scheduler collects before it stops (its adaptive rule)."""
    if nodes < 100:
        return nodes
    percent = max(5, 50 - nodes // 125)
    return max(100, nodes * percent // 100)


def run(nodes: int, pods: int, iterations: int, binds: int, seed: int = 1) -> dict[str, Any]:
    """Build the cluster, serve it from a child process, measure; one dict of figures."""
    rng = random.Random(seed)
    state = ClusterState(Limits(), time.monotonic)
    state.replace_nodes(_node(f"node-{i:05d}") for i in range(nodes))
    placed = _place_tenants(state, rng, nodes, pods)
    pending = {f"pending-{i}": _pod(f"pending-{i}", rng) for i in range(binds)}
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    child = multiprocessing.get_context("fork").Process(
        target=_serve, args=(sock, state, pending), daemon=True
    )
    child.start()
    try:
        figures = _drive(port, rng, nodes, iterations, pending, child.pid)
    finally:
        child.terminate()
        child.join(10)
        sock.close()
    per_call = nodes_to_score(nodes)
    return {
        "nodes": nodes,
        "pods": placed,
        "pods_asked": pods,
        "pods_unplaced": pods - placed,
        "node_names_per_call": per_call,
        **figures,
    }


def _drive(
    port: int,
    rng: random.Random,
    nodes: int,
    iterations: int,
    pending: dict[str, Any],
    server_pid: int | None,
) -> dict[str, Any]:
    names = [f"node-{i:05d}" for i in range(nodes)]
    per_call = nodes_to_score(nodes)
    bodies = [_args(_pod(f"new-{i}", rng), rng.sample(names, per_call)) for i in range(iterations)]
    conn = _connect(port)
    _call(conn, "/filter", bodies[0])
    cpu = _CpuMeter(server_pid)
    filter_ms, passed = [], []
    for body in bodies:
        elapsed, answer = _timed(conn, "/filter", body)
        filter_ms.append(elapsed)
        passed.append(json.loads(answer)["NodeNames"])
    filter_cpu = cpu.per_request(len(bodies))
    prioritize_bodies = []
    for body, feasible in zip(bodies, passed, strict=True):
        args = json.loads(body)
        args["NodeNames"] = feasible
        prioritize_bodies.append(json.dumps(args).encode())
    cpu = _CpuMeter(server_pid)
    prioritize_ms = [_timed(conn, "/prioritize", body)[0] for body in prioritize_bodies]
    prioritize_cpu = cpu.per_request(len(prioritize_bodies))
    bind_ms, bind_errors = _binds(conn, rng, names, per_call, pending)
    conn.close()
    rate, _ = _throughput(port, bodies)
    return {
        "filter_p50_ms": _pct(filter_ms, 50),
        "filter_p99_ms": _pct(filter_ms, 99),
        "prioritize_p50_ms": _pct(prioritize_ms, 50),
        "prioritize_p99_ms": _pct(prioritize_ms, 99),
        "bind_p50_ms": _pct(bind_ms, 50),
        "bind_p99_ms": _pct(bind_ms, 99),
        "bind_errors": bind_errors,
        "feasible_nodes_mean": round(sum(map(len, passed)) / len(passed), 1),
        "requests_per_s": rate,
        "server_cpu_ms_per_filter": filter_cpu,
        "server_cpu_ms_per_prioritize": prioritize_cpu,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "iterations": iterations,
        "bind_api": "in-memory",
    }


class _CpuMeter:
    """The server process's CPU time since construction, per request."""

    def __init__(self, pid: int | None):
        self._pid = pid
        self._start = _cpu_seconds(pid)

    def per_request(self, count: int) -> float | None:
        end = _cpu_seconds(self._pid)
        if self._start is None or end is None or not count:
            return None
        return round((end - self._start) * 1000 / count, 3)


def _binds(
    conn: http.client.HTTPConnection,
    rng: random.Random,
    names: list[str],
    per_call: int,
    pending: dict[str, Any],
) -> tuple[list[float], int]:
    times, errors = [], 0
    for name, pod in pending.items():
        answer = json.loads(_call(conn, "/filter", _args(pod, rng.sample(names, per_call))))
        if not answer["NodeNames"]:
            errors += 1
            continue
        args = {
            "PodName": name,
            "PodNamespace": "default",
            "PodUID": pod["metadata"]["uid"],
            "Node": answer["NodeNames"][0],
        }
        elapsed, result = _timed(conn, "/bind", json.dumps(args).encode())
        times.append(elapsed)
        errors += bool(json.loads(result)["Error"])
    return times, errors


def _throughput(
    port: int, bodies: list[bytes], clients: int = 4, seconds: float = 3.0
) -> tuple[float, int]:
    """Filter requests per second with several keep-alive clients at once, and how many."""
    counts = [0] * clients
    deadline = time.perf_counter() + seconds

    def client(slot: int) -> None:
        conn = _connect(port)
        i = slot
        while time.perf_counter() < deadline:
            _call(conn, "/filter", bodies[i % len(bodies)])
            counts[slot] += 1
            i += clients
        conn.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(slot,)) for slot in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 60)
    return round(sum(counts) / (time.perf_counter() - started), 1), sum(counts)


def _cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time of a process (Linux /proc), or None where unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _connect(port: int) -> http.client.HTTPConnection:
    """A keep-alive connection with Nagle off, as Go's HTTP client (kube-scheduler) has it."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.connect()
    assert conn.sock is not None
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def _call(conn: http.client.HTTPConnection, path: str, body: bytes) -> bytes:
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    if resp.status != 200:
        raise RuntimeError(f"{path} answered {resp.status}: {data[:200]!r}")
    return data


def _timed(conn: http.client.HTTPConnection, path: str, body: bytes) -> tuple[float, bytes]:
    started = time.perf_counter()
    data = _call(conn, path, body)
    return (time.perf_counter() - started) * 1000, data


def _pct(values: list[float], pct: int) -> float | None:
    """The `pct` percentile of `values`; None for no values (no call of that verb was made)."""
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * len(ordered) + 0.5) - 1))
    return round(ordered[index], 3)


def _serve(sock: socket.socket, state: ClusterState, pending: dict[str, Any]) -> None:
    from extender.app import create_app
    from extender.metrics import Metrics
    from extender.server import Server

    cache = ClusterCache(state)
    for kind in KINDS:
        cache.mark_synced(kind)
    binder = Binder(cache, MemoryPodApi(pending), time.time_ns)
    Server(create_app(cache, binder, Metrics()), on_stop=binder.close).run(sockets=[sock])


class MemoryPodApi:
    """`PodApi` on a dict of pods: what the bench binds against."""

    def __init__(self, pods: dict[str, Any]):
        self._pods = pods

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        """The stored pod."""
        try:
            return dict(self._pods[name])
        except KeyError:
            raise ApiFailure(f"pod {namespace}/{name} not found") from None

    async def bind_pod(
        self,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        resource_version: str = "",
        annotations: dict[str, str] | None = None,
    ) -> None:
        """Record the binding and its annotations."""
        self._pods[name]["metadata"]["annotations"].update(annotations or {})
        self._pods[name]["spec"]["nodeName"] = node

    def close(self) -> None:
        """Nothing is kept open."""


def _place_tenants(state: ClusterState, rng: random.Random, nodes: int, pods: int) -> int:
    """Each pod on a random node where it fits there; how many were placed."""
    placed = 0
    for i in range(pods):
        pod = _pod(f"tenant-{i}", rng)
        request = parse_pod_request(pod)
        assert request is not None
        name = f"node-{rng.randrange(nodes):05d}"
        node = state.node(name)
        verdict = place(node, request, state.limits) if node else None
        if verdict and verdict.fits:
            pod["spec"]["nodeName"] = name
            pod["metadata"]["annotations"][ANNOTATION_ASSIGNED_GPUS] = ",".join(verdict.gpus)
            pod["status"]["phase"] = "Running"
            state.upsert_pod(pod)
            placed += 1
    return placed


def _args(pod: dict[str, Any], names: list[str]) -> bytes:
    return json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode()


def _node(name: str) -> dict[str, Any]:
    gpus = [
        gpu_fields(GpuRecord(f"GPU-{name}-{i}", i, GPU_MODEL, GPU_MIB, 4))
        for i in range(GPUS_PER_NODE)
    ]
    notes = {ANNOTATION_GPUS: json.dumps(gpus), ANNOTATION_HOST_MEMORY_BUDGET: str(1536 * 1024)}
    return {"metadata": {"name": name, "annotations": notes}}


def _pod(name: str, rng: random.Random) -> dict[str, Any]:
    """A pod as kube-scheduler's informer holds it (managed fields stripped)."""
    limits = {"cpu": "16", "memory": "256Gi", RESOURCE_GPU: "1"}
    memory, duty = rng.choice(MEMORY_SHAPES), rng.choice(DUTY_SHAPES)
    if memory is not None:
        limits[RESOURCE_GPU_MEMORY] = str(memory + rng.randrange(0, 1024))
    if duty is not None:
        limits[RESOURCE_GPU_DUTY] = str(duty + rng.randrange(0, 5))
    uid = f"{rng.getrandbits(128):032x}"
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"{uid[:8]}-{uid[8:12]}-{uid[12:16]}-{uid[16:20]}-{uid[20:]}",
            "resourceVersion": str(rng.randrange(1, 10**7)),
            "creationTimestamp": "2026-11-29T20:00:00Z",
            "labels": {"app": "grpo", "batch.kubernetes.io/job-name": "grpo-actor"},
            "annotations": {},
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": "grpo-actor",
                    "uid": "5f0c3c5e-4a39-4f55-9a7e-0d9b7f3c1a11",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 30,
            "serviceAccountName": "default",
            "containers": [
                {
                    "name": "trainer",
                    "image": "registry.example/grpo:1.4",
                    "command": ["python", "-m", "train", "--config", "/etc/grpo/config.yaml"],
                    "env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
                    "resources": {"limits": limits, "requests": dict(limits)},
                    "volumeMounts": [{"name": "config", "mountPath": "/etc/grpo"}],
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "volumes": [{"name": "config", "configMap": {"name": "grpo-config"}}],
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
            ],
            "priority": 0,
            "enableServiceLinks": True,
        },
        "status": {"phase": "Pending", "qosClass": "Guaranteed"},
    }

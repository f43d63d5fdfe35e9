"""`baton bench allocate`: Allocate latency as the kubelet sees it, over the plugin's socket."""

from __future__ import annotations

import contextlib
import logging
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc

from baton._pb import api_pb2, api_pb2_grpc
from baton.contract import names
from baton.contract.annotations import assignment_annotations
from baton.contract.unixsocket import unix_target
from commands.bench.memory_pods import MemoryPods
from deviceplugin.daemon import Daemon, Settings
from deviceplugin.devices import PodView
from nodegpu.gpus import parse_fake_gpus

NODE = "bench-node"


def _percentile(samples: list[float], share: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


ASSIGNED_FROM_NS = 1_767_225_600 * 10**9
"""2026-01-01T00:00:00Z: the bench's pods are assigned this many nanoseconds after it."""


def _pods(count: int, gpus: list[str], start: int) -> list[PodView]:
    return [
        PodView(
            namespace="bench",
            name=f"tenant-{start + i}",
            uid=f"uid-{start + i}",
            resource_version="1",
            phase="Pending",
            gpu_request=1,
            assigned_gpus=(gpus[i % len(gpus)],),
            assigned_at_ns=start + i,
            allocated=False,
            created_ns=start + i,
        )
        for i in range(count)
    ]


def _pod_object(pod: PodView) -> dict[str, Any]:
    limits = {names.RESOURCE_GPU: str(pod.gpu_request)}
    annotations = assignment_annotations(
        pod.assigned_gpus, ASSIGNED_FROM_NS + (pod.assigned_at_ns or 0)
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod.name, "namespace": "default", "annotations": annotations},
        "spec": {"nodeName": NODE, "containers": [{"name": "c", "resources": {"limits": limits}}]},
        "status": {"phase": "Pending"},
    }


@contextlib.contextmanager
def _fake_api(pods: list[PodView], workdir: Path) -> Iterator[Any]:
    """The repository's fake API server (tests/harness) loaded with the pods; an API client."""
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "tests" / "harness" / "fakeapi.py").is_file():
        sys.path.insert(0, str(checkout))
    try:
        from tests.harness.fakeapi import FakeApiServer
    except ImportError as err:
        raise SystemExit("--api fake needs a source checkout (tests/harness/fakeapi.py)") from err
    from baton.contract.kube import load_api_client

    server = FakeApiServer().start()
    server.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    for pod in pods:
        server.put_object(_pod_object(pod))
    client = load_api_client(str(server.kubeconfig_path(workdir)))
    try:
        yield client
    finally:
        client.close()
        server.stop()


def run(iterations: int, idle_pods: int, api: str) -> dict[str, object]:
    """Admit `iterations` assigned pods one by one (among `idle_pods` running ones)."""
    logging.getLogger("deviceplugin").setLevel(logging.ERROR)
    logging.getLogger("nodegpu").setLevel(logging.ERROR)
    workdir = Path(tempfile.mkdtemp(prefix="dpb-", dir="/tmp"))
    gpus = parse_fake_gpus("8x81920", NODE)
    uuids = [g.uuid for g in gpus]
    running = [replace(p, allocated=True, phase="Running") for p in _pods(idle_pods, uuids, 0)]
    waiting = _pods(iterations, uuids, idle_pods)
    settings = Settings(
        node_name=NODE,
        plugin_dir=workdir,
        metrics_host="127.0.0.1",
        metrics_port=0,
        pod_resources_socket=None,  # Allocate's path only: reconciliation runs beside it
    )
    try:
        with contextlib.ExitStack() as stack:
            if api == "fake":
                client = stack.enter_context(_fake_api(running + waiting, workdir))
                daemon = Daemon(settings, gpus, fake=True, api_client=client)
            else:
                daemon = Daemon(settings, gpus, fake=True, source=MemoryPods(running + waiting))
            daemon.start()
            stack.callback(daemon.stop)
            return _measure(daemon, iterations, uuids, settings.slots_per_gpu) | {
                "api": api,
                "pods": idle_pods + iterations,
            }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _measure(daemon: Daemon, iterations: int, uuids: list[str], slots: int) -> dict[str, object]:
    devices = [names.slot_device_id(u, s) for u in uuids for s in range(slots)]
    allocate_ms: list[float] = []
    preferred_ms: list[float] = []
    with grpc.insecure_channel(unix_target(daemon.plugin.server.socket_path)) as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        for _ in range(iterations):
            began = time.perf_counter()
            answer = stub.GetPreferredAllocation(
                api_pb2.PreferredAllocationRequest(
                    container_requests=[
                        api_pb2.ContainerPreferredAllocationRequest(
                            available_deviceIDs=devices, allocation_size=1
                        )
                    ]
                ),
                timeout=10,
            )
            preferred_ms.append((time.perf_counter() - began) * 1000)
            chosen = list(answer.container_responses[0].deviceIDs)
            began = time.perf_counter()
            stub.Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=chosen)]
                ),
                timeout=10,
            )
            allocate_ms.append((time.perf_counter() - began) * 1000)
    return {
        "allocate_p50_ms": round(statistics.median(allocate_ms), 3),
        "allocate_p99_ms": round(_percentile(allocate_ms, 0.99), 3),
        "preferred_p99_ms": round(_percentile(preferred_ms, 0.99), 3),
        "iterations": iterations,
    }

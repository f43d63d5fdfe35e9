"""The kubelet's PodResources API (v1) for the kubelet stub: what it allocated, per container.

Like the kubelet, it lists each admitted pod's app containers (and sidecars, init containers
with `restartPolicy: Always`) with the device IDs its device manager gave them; ordinary init
containers are not listed, though they were allocated devices too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from baton._pb import api_pb2
from baton._pb import podresources_pb2 as pb
from baton._pb import podresources_pb2_grpc as pb_grpc

POD_RESOURCES_SOCKET = "kubelet.sock"


@dataclass(frozen=True)
class ContainerAsk:
    """One container of a pod spec: its name and how many devices of the resource it asks."""

    name: str
    count: int
    sidecar: bool = False


@dataclass
class AdmittedPod:
    """What the kubelet allocated to one pod: device IDs and Allocate's answer, per container."""

    namespace: str
    name: str
    listed: list[str] = field(default_factory=list)
    """Containers PodResources lists (app containers and sidecars), in spec order."""
    devices: dict[str, list[str]] = field(default_factory=dict)
    envs: dict[str, dict[str, str]] = field(default_factory=dict)
    answers: dict[str, api_pb2.ContainerAllocateResponse] = field(default_factory=dict)


class PodResourcesRecord:
    """The admitted pods (shared by the stub's device manager and its PodResources server)."""

    def __init__(self, resource: str) -> None:
        self.resource = resource
        self.pods: dict[tuple[str, str], AdmittedPod] = {}
        self.lists = 0
        self._lock = threading.Lock()

    def add(self, pod: AdmittedPod) -> None:
        with self._lock:
            self.pods[(pod.namespace, pod.name)] = pod

    def remove(self, namespace: str, name: str) -> AdmittedPod | None:
        with self._lock:
            return self.pods.pop((namespace, name), None)

    def message(self, pod: AdmittedPod) -> pb.PodResources:
        containers = [
            pb.ContainerResources(
                name=c,
                devices=[
                    pb.ContainerDevices(resource_name=self.resource, device_ids=pod.devices[c])
                ]
                if pod.devices.get(c)
                else [],
            )
            for c in pod.listed
        ]
        return pb.PodResources(name=pod.name, namespace=pod.namespace, containers=containers)

    def snapshot(self) -> list[AdmittedPod]:
        with self._lock:
            self.lists += 1
            return list(self.pods.values())


class _Lister(pb_grpc.PodResourcesListerServicer):
    def __init__(self, record: PodResourcesRecord, allocatable: Callable[[], list[str]]) -> None:
        self.record = record
        self.allocatable = allocatable

    def List(
        self, request: pb.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pb.ListPodResourcesResponse:
        pods = self.record.snapshot()
        return pb.ListPodResourcesResponse(pod_resources=[self.record.message(p) for p in pods])

    def Get(
        self, request: pb.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> pb.GetPodResourcesResponse:
        pod = self.record.pods.get((request.pod_namespace, request.pod_name))
        if pod is None:
            context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"pod {request.pod_name} not found in {request.pod_namespace}",
            )
        assert pod is not None  # abort raised
        return pb.GetPodResourcesResponse(pod_resources=self.record.message(pod))

    def GetAllocatableResources(
        self, request: pb.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> pb.AllocatableResourcesResponse:
        ids = self.allocatable()
        devices = [pb.ContainerDevices(resource_name=self.record.resource, device_ids=ids)]
        return pb.AllocatableResourcesResponse(devices=devices if ids else [])


class PodResourcesServer:
    """Serves PodResourcesLister on `<directory>/kubelet.sock` from a record."""

    def __init__(
        self, directory: Path, record: PodResourcesRecord, allocatable: Callable[[], list[str]]
    ) -> None:
        self.socket_path = directory / POD_RESOURCES_SOCKET
        self.record = record
        self._allocatable = allocatable
        self._server: grpc.Server | None = None

    def start(self) -> None:
        lister = _Lister(self.record, self._allocatable)
        self._server = unix_server(
            self.socket_path, lambda s: pb_grpc.add_PodResourcesListerServicer_to_server(lister, s)
        )

    def stop(self) -> None:
        stop_server(self._server)
        self._server = None
        self.socket_path.unlink(missing_ok=True)


def unix_server(socket_path: Path, add: Callable[[grpc.Server], None]) -> grpc.Server:
    """A started gRPC server on the Unix socket, with the servicers `add` puts on it."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    add(server)
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    return server


def stop_server(server: grpc.Server | None) -> None:
    """Stop the server (if any) and wait, bounded, for it."""
    if server is not None:
        server.stop(grace=None).wait(5)

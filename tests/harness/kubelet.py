"""A kubelet stand-in for device plugin tests, shaped like kubelet's own stub: one type per role.

`RegistrationServer` and `PluginEndpoint` (`kubeletplugin.py`) are the kubelet's server for and
client to the plugins; `KubeletStub` here is the device manager tying them together: device
accounting, admission one container request per call (a whole pod: init containers first, their
devices reused by later containers, as the kubelet's device manager does; pods in whatever order
the test admits them), its PodResources API (`podresources.py`) when given a directory for it,
and a simulated restart (delete the sockets, recreate kubelet.sock).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from baton._pb import api_pb2
from baton.contract import names
from tests.harness.kubeletplugin import DIAL_TIMEOUT_S, PluginEndpoint, RegistrationServer
from tests.harness.podresources import (
    AdmittedPod,
    ContainerAsk,
    PodResourcesRecord,
    PodResourcesServer,
)

CHECKPOINT = "kubelet_internal_checkpoint"


class AdmissionError(Exception):
    """The kubelet would fail the pod's admission with this message."""


class KubeletStub:
    """Device manager stand-in: registrations, device accounting, container admission."""

    def __init__(
        self,
        socket_dir: Path,
        pod_resources_dir: Path | None = None,
        resource: str = names.RESOURCE_GPU,
    ) -> None:
        self.socket_dir = socket_dir
        self.registrations: list[api_pb2.RegisterRequest] = []
        self.endpoints: dict[str, PluginEndpoint] = {}
        self.allocated: dict[str, set[str]] = {}
        self._changed = threading.Condition()
        self._admit = threading.Lock()
        self.restarted_at: float | None = None
        self.registered_at: list[float] = []
        self.registration = RegistrationServer(socket_dir, self._on_register)
        self.record = PodResourcesRecord(resource)
        self.pod_resources = (
            PodResourcesServer(pod_resources_dir, self.record, self._allocatable)
            if pod_resources_dir is not None
            else None
        )

    def start(self) -> None:
        self.registration.start()
        if self.pod_resources is not None:
            self.pod_resources.start()

    def stop(self) -> None:
        self.registration.stop()
        if self.pod_resources is not None:
            self.pod_resources.stop()
        for endpoint in list(self.endpoints.values()):
            endpoint.stop()

    def _on_register(self, request: api_pb2.RegisterRequest) -> None:
        endpoint = PluginEndpoint(
            self.socket_dir / request.endpoint, request.resource_name, self._changed
        )
        with self._changed:
            old = self.endpoints.get(request.resource_name)
            self.endpoints[request.resource_name] = endpoint
            self.registrations.append(request)
            self.registered_at.append(time.monotonic())
            self._changed.notify_all()
        if old is not None:
            old.stop()

    def wait_for_registrations(self, count: int, timeout: float = 5.0) -> api_pb2.RegisterRequest:
        """Block until `count` registrations were accepted in total; the latest one."""
        with self._changed:
            if not self._changed.wait_for(lambda: len(self.registrations) >= count, timeout):
                raise TimeoutError(
                    f"{len(self.registrations)} registrations after {timeout} s, wanted {count}; "
                    f"refused: {self.registration.refusals}"
                )
            return self.registrations[count - 1]

    def wait_for_registration_after(self, since: float, timeout: float = 5.0) -> float:
        """Block until a registration arrives after monotonic time `since`; its time."""

        def later() -> list[float]:
            return [t for t in self.registered_at if t >= since]

        with self._changed:
            if not self._changed.wait_for(later, timeout):
                raise TimeoutError(
                    f"no registration within {timeout} s; refused: {self.registration.refusals}"
                )
            return later()[0]

    def wait_for_list(
        self, resource: str, accept: Callable[[dict[str, str]], bool], timeout: float = 5.0
    ) -> dict[str, str]:
        """Block until the current endpoint's last list satisfies `accept` (following
        re-registrations, which replace the endpoint); TimeoutError says what was seen."""

        def matching() -> bool:
            endpoint = self.endpoints.get(resource)
            return endpoint is not None and bool(endpoint.lists) and accept(endpoint.lists[-1])

        with self._changed:
            if not self._changed.wait_for(matching, timeout):
                endpoint = self.endpoints.get(resource)
                seen = endpoint.lists if endpoint else "no endpoint"
                raise TimeoutError(f"no matching {resource} list within {timeout} s: {seen}")
            return dict(self.endpoints[resource].lists[-1])

    def endpoint(self, resource: str) -> PluginEndpoint:
        with self._changed:
            return self.endpoints[resource]

    def free_devices(self, resource: str) -> list[str]:
        """Healthy devices of the resource that no container holds."""
        latest = self.endpoint(resource).latest()
        taken = self.allocated.get(resource, set())
        return sorted(d for d, h in latest.items() if h == "Healthy" and d not in taken)

    def _allocatable(self) -> list[str]:
        endpoint = self.endpoints.get(self.record.resource)
        return sorted(endpoint.latest()) if endpoint is not None else []

    def admit(
        self, resource: str, count: int
    ) -> tuple[list[str], api_pb2.ContainerAllocateResponse]:
        """Allocate `count` devices to one container as the kubelet does; AdmissionError if not."""
        with self._admit:
            return self._admit_container(resource, count, set())

    def admit_pod(
        self, namespace: str, name: str, containers: list[ContainerAsk], inits: list[ContainerAsk]
    ) -> AdmittedPod:
        """Allocate every container of a pod, init containers first, as the device manager does:
        an init container's devices may be reused by the containers after it."""
        resource = self.record.resource
        pod = AdmittedPod(namespace, name, [c.name for c in (*inits, *containers) if c.sidecar])
        pod.listed += [c.name for c in containers]
        reusable: set[str] = set()
        with self._admit:
            for ask in (*inits, *containers):
                if ask.count:
                    devices, answer = self._admit_container(resource, ask.count, reusable)
                    pod.devices[ask.name], pod.envs[ask.name] = devices, dict(answer.envs)
                    pod.answers[ask.name] = answer
                    if ask in inits and not ask.sidecar:
                        reusable |= set(devices)
                    else:
                        reusable -= set(devices)
        self.record.add(pod)
        return pod

    def release_pod(self, namespace: str, name: str) -> None:
        """The pod ended: free its devices and drop it from PodResources."""
        pod = self.record.remove(namespace, name)
        if pod is not None:
            self.release(self.record.resource, [d for ids in pod.devices.values() for d in ids])

    def _admit_container(
        self, resource: str, count: int, reusable: set[str]
    ) -> tuple[list[str], api_pb2.ContainerAllocateResponse]:
        if resource not in self.endpoints:
            raise AdmissionError(f"cannot allocate unregistered device {resource}")
        endpoint = self.endpoint(resource)
        reused = sorted(reusable)[:count]
        needed = count - len(reused)
        available = self.free_devices(resource)
        if len(available) < needed:
            raise AdmissionError(
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {needed}, Available: {len(available)}"
            )
        chosen = reused + available[:needed]
        if (
            needed
            and endpoint.options.get_preferred_allocation_available
            and needed < len(available)
        ):
            chosen = self._preferred(endpoint, available + reused, reused, count)
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=chosen)]
        )
        try:
            response = endpoint.stub.Allocate(request, timeout=DIAL_TIMEOUT_S)
        except grpc.RpcError as err:
            raise AdmissionError(
                f"Allocate failed due to rpc error: code = {err.code().name} "
                f"desc = {err.details()}, which is unexpected"
            ) from err
        if not response.container_responses:
            raise AdmissionError("no containers return in allocation response")
        self.allocated.setdefault(resource, set()).update(chosen)
        return chosen, response.container_responses[0]

    def _preferred(
        self, endpoint: PluginEndpoint, available: list[str], must: list[str], count: int
    ) -> list[str]:
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available,
                    must_include_deviceIDs=must,
                    allocation_size=count,
                )
            ]
        )
        answer = endpoint.stub.GetPreferredAllocation(request, timeout=DIAL_TIMEOUT_S)
        preferred = [d for d in answer.container_responses[0].deviceIDs if d in available]
        chosen = list(dict.fromkeys([*must, *preferred]))[:count]
        chosen += [d for d in available if d not in chosen][: count - len(chosen)]
        return chosen

    def release(self, resource: str, devices: list[str]) -> None:
        """Free devices (their pod ended)."""
        self.allocated.get(resource, set()).difference_update(devices)

    def drop(self, resource: str) -> None:
        """Disconnect the resource's current plugin, with no new registration: what the real
        device manager does when an older registration's stream ends after a newer one (its
        runClient disconnects whichever client is current)."""
        with self._changed:
            endpoint = self.endpoints.pop(resource)
        endpoint.stop()

    def restart(self) -> None:
        """Simulate a kubelet restart: drop plugins, delete sockets, serve a new kubelet.sock."""
        self.registration.stop()
        with self._changed:
            endpoints, self.endpoints = list(self.endpoints.values()), {}
        for endpoint in endpoints:
            endpoint.stop()
        for path in self.socket_dir.iterdir():
            if path.name != CHECKPOINT and path.is_socket():
                path.unlink()
        self.registration = RegistrationServer(self.socket_dir, self._on_register)
        self.registration.start()
        self.restarted_at = time.monotonic()

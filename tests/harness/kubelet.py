"""A kubelet stand-in for device plugin tests, shaped like kubelet's own stub: one type per role.

`RegistrationServer` serves Registration on `<dir>/kubelet.sock` and validates requests as the
kubelet does; `PluginEndpoint` is the kubelet's client to one plugin (options, a ListAndWatch
stream whose every list is recorded, GetPreferredAllocation/Allocate); `KubeletStub` is the device
manager tying them together: device accounting, admission one container request per call (a
whole pod: init containers first, their devices reused by later containers, as the kubelet's
device manager does; pods in whatever order the test admits them), its PodResources API
(`podresources.py`) when given a directory for it, and a simulated restart (delete the sockets,
recreate kubelet.sock).
"""

from __future__ import annotations

import re
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from baton._pb import api_pb2, api_pb2_grpc
from baton.contract import names
from tests.harness.podresources import (
    AdmittedPod,
    ContainerAsk,
    PodResourcesRecord,
    PodResourcesServer,
    stop_server,
    unix_server,
)

SUPPORTED_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
CHECKPOINT = "kubelet_internal_checkpoint"
DIAL_TIMEOUT_S = 10.0
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

Lists = list[dict[str, str]]


def is_extended_resource_name(name: str) -> bool:
    """kubelet's IsExtendedResourceName: `prefix/name`, not kubernetes.io, a qualified name."""
    if "/" not in name or name.startswith("requests."):
        return False
    prefix, _, short = name.partition("/")
    if prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io"):
        return False
    qualified_prefix = prefix
    return (
        0 < len(qualified_prefix) <= 253
        and all(_DNS_LABEL.match(label) for label in qualified_prefix.split("."))
        and 0 < len(short) <= 63
        and bool(_NAME.match(short))
    )


def validate_registration(request: api_pb2.RegisterRequest, socket_dir: Path) -> str | None:
    """The kubelet's refusal message for a RegisterRequest, or None when it is acceptable."""
    if request.version != SUPPORTED_VERSION:
        return (
            f"requested API version {request.version!r} is not supported by kubelet. "
            f"Supported version is {SUPPORTED_VERSION!r}"
        )
    if not is_extended_resource_name(request.resource_name):
        return f"the ResourceName {request.resource_name!r} is invalid"
    endpoint = socket_dir / request.endpoint
    if not request.endpoint or "/" in request.endpoint:
        return f"endpoint {request.endpoint!r} must be a socket name in {socket_dir}"
    if not endpoint.exists() or not stat.S_ISSOCK(endpoint.stat().st_mode):
        return f"failed to dial device plugin: no socket at {endpoint}"
    return None


class RegistrationServer:
    """Serves the Registration service on `<socket_dir>/kubelet.sock`."""

    def __init__(
        self, socket_dir: Path, on_register: Callable[[api_pb2.RegisterRequest], None]
    ) -> None:
        self.socket_dir = socket_dir
        self.on_register = on_register
        self.refusals: list[str] = []
        self._server: grpc.Server | None = None

    @property
    def socket_path(self) -> Path:
        return self.socket_dir / KUBELET_SOCKET

    def start(self) -> None:
        registration = _Registration(self)
        self._server = unix_server(
            self.socket_path,
            lambda s: api_pb2_grpc.add_RegistrationServicer_to_server(registration, s),
        )

    def stop(self) -> None:
        stop_server(self._server)
        self._server = None


class _Registration(api_pb2_grpc.RegistrationServicer):
    def __init__(self, owner: RegistrationServer) -> None:
        self.owner = owner

    def Register(
        self, request: api_pb2.RegisterRequest, context: grpc.ServicerContext
    ) -> api_pb2.Empty:
        problem = validate_registration(request, self.owner.socket_dir)
        if problem is None:
            try:
                self.owner.on_register(request)
            except Exception as err:
                problem = f"failed to get device plugin options: {err}"
        if problem is not None:
            self.owner.refusals.append(problem)
            context.abort(grpc.StatusCode.UNKNOWN, problem)
        return api_pb2.Empty()


class PluginEndpoint:
    """The kubelet's client to one plugin: dials it, reads options, records every list."""

    def __init__(
        self, socket_path: Path, resource: str, changed: threading.Condition | None = None
    ) -> None:
        self.socket_path = socket_path
        self.resource = resource
        self.lists: Lists = []
        self.ended = threading.Event()
        self._changed = changed or threading.Condition()
        self._channel = grpc.insecure_channel(
            f"unix://{socket_path}", options=[("grpc.default_authority", "localhost")]
        )
        grpc.channel_ready_future(self._channel).result(timeout=DIAL_TIMEOUT_S)
        self.stub = api_pb2_grpc.DevicePluginStub(self._channel)
        self.options = self.stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=DIAL_TIMEOUT_S)
        self._stream = self.stub.ListAndWatch(api_pb2.Empty())
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        try:
            for response in self._stream:
                with self._changed:
                    self.lists.append({d.ID: d.health for d in response.devices})
                    self._changed.notify_all()
        except grpc.RpcError:
            pass
        finally:
            with self._changed:
                self.ended.set()
                self._changed.notify_all()

    def latest(self) -> dict[str, str]:
        """The last list received (empty before the first)."""
        with self._changed:
            return dict(self.lists[-1]) if self.lists else {}

    def wait_for_list(
        self, accept: Callable[[dict[str, str]], bool], timeout: float = 5.0
    ) -> dict[str, str]:
        """Block until a received list satisfies `accept`; TimeoutError says what was seen."""
        with self._changed:
            if not self._changed.wait_for(
                lambda: bool(self.lists) and accept(self.lists[-1]), timeout
            ):
                raise TimeoutError(f"no matching list within {timeout} s; lists: {self.lists}")
            return dict(self.lists[-1])

    def stop(self) -> None:
        self._stream.cancel()
        self._channel.close()
        self._thread.join(timeout=5)


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

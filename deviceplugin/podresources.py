"""A client of the kubelet's PodResources API (v1): which devices each container was allocated."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import grpc

from baton._pb import podresources_pb2, podresources_pb2_grpc
from baton.contract import names
from baton.contract.unixsocket import unix_target
from deviceplugin.errors import DevicePluginError

CALL_TIMEOUT_S = 5.0

PodKey = tuple[str, str]
"""(namespace, name)."""
Allocations = dict[PodKey, dict[str, tuple[str, ...]]]
"""Pod → container name → the device IDs of one resource the kubelet allocated to it."""


class PodResourcesUnavailableError(DevicePluginError):
    """The kubelet's PodResources socket does not answer."""


def allocations(pods: Iterable[podresources_pb2.PodResources], resource: str) -> Allocations:
    """Per pod and container, the device IDs of `resource` (containers without any left out)."""
    found: Allocations = {}
    for pod in pods:
        for container in pod.containers:
            ids = tuple(
                sorted(
                    device_id
                    for devices in container.devices
                    if devices.resource_name == resource
                    for device_id in devices.device_ids
                )
            )
            if ids:
                found.setdefault((pod.namespace, pod.name), {})[container.name] = ids
    return found


class PodResourcesClient:
    """Lists the kubelet's per-container allocations over its unix socket."""

    def __init__(self, socket_path: Path, resource: str = names.RESOURCE_GPU) -> None:
        self.socket_path = socket_path
        self.resource = resource
        self._channel = grpc.insecure_channel(
            unix_target(socket_path), options=[("grpc.default_authority", "localhost")]
        )
        self._stub = podresources_pb2_grpc.PodResourcesListerStub(self._channel)

    def list(self) -> Allocations:
        """Every pod's allocations of the resource, as the kubelet has them now."""
        try:
            response = self._stub.List(
                podresources_pb2.ListPodResourcesRequest(), timeout=CALL_TIMEOUT_S
            )
        except grpc.RpcError as err:
            raise PodResourcesUnavailableError(
                f"cannot list the kubelet's pod resources at {self.socket_path}: "
                f"{err.code().name} {err.details()} (is {names.KUBELET_POD_RESOURCES_DIR} "
                "mounted into the device plugin?)"
            ) from err
        return allocations(response.pod_resources, self.resource)

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

"""Registering the plugin's resource with the kubelet (Registration service on kubelet.sock)."""

from __future__ import annotations

from pathlib import Path

import grpc

from baton._pb import api_pb2, api_pb2_grpc
from baton.contract.unixsocket import unix_target

API_VERSION = "v1beta1"
REGISTER_TIMEOUT_S = 5.0


class RegistrationError(Exception):
    """The kubelet could not be reached or refused the registration."""


def register(kubelet_socket: Path, endpoint: str, resource_name: str) -> None:
    """Tell the kubelet that `resource_name` is served on `endpoint` (a socket name in its dir)."""
    request = api_pb2.RegisterRequest(
        version=API_VERSION,
        endpoint=endpoint,
        resource_name=resource_name,
        options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=True),
    )
    target = unix_target(kubelet_socket)
    try:
        with grpc.insecure_channel(target) as channel:
            # Not wait_for_ready: a stale kubelet.sock (kubelet restarting) fails at once.
            api_pb2_grpc.RegistrationStub(channel).Register(request, timeout=REGISTER_TIMEOUT_S)
    except grpc.RpcError as err:
        if err.code() == grpc.StatusCode.UNAVAILABLE:
            raise RegistrationError(
                f"cannot reach the kubelet at {kubelet_socket}: {err.details()}"
            ) from err
        raise RegistrationError(
            f"kubelet refused to register {resource_name}: {err.code().name} {err.details()}"
        ) from err

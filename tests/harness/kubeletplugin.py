"""The kubelet's two ends toward a device plugin, as in kubelet's own stub.

`RegistrationServer` serves Registration on `<dir>/kubelet.sock` and validates requests as the
kubelet does; `PluginEndpoint` is the kubelet's client to one plugin (options, a ListAndWatch
stream whose every list is recorded, and the stub for GetPreferredAllocation/Allocate).
"""

from __future__ import annotations

import re
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import grpc

from baton._pb import api_pb2, api_pb2_grpc
from tests.harness.podresources import stop_server, unix_server

SUPPORTED_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
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

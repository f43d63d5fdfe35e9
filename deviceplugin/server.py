"""The DevicePlugin gRPC service that the kubelet calls, served on the plugin's unix socket."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc

from baton._pb import api_pb2, api_pb2_grpc
from baton.contract.unixsocket import ServedSocket
from deviceplugin.allocation import Allocator
from deviceplugin.devices import HEALTHY, UNHEALTHY
from nodegpu.container import ContainerAllocation
from nodegpu.inventory import Inventory
from nodegpu.metrics import Metrics
from nodegpu.state import LiveInventory

log = logging.getLogger(__name__)
_STREAM_RECHECK_S = 30.0
READY_TIMEOUT_S = 5.0


def list_response(inventory: Inventory) -> api_pb2.ListAndWatchResponse:
    """The full device list as kubelet expects it on every ListAndWatch message."""
    return api_pb2.ListAndWatchResponse(
        devices=[
            api_pb2.Device(ID=d.id, health=HEALTHY if d.healthy else UNHEALTHY)
            for d in inventory.devices()
        ]
    )


def container_response(allocation: ContainerAllocation) -> api_pb2.ContainerAllocateResponse:
    """One container's Allocate answer."""
    return api_pb2.ContainerAllocateResponse(
        envs=allocation.envs,
        mounts=[
            api_pb2.Mount(container_path=c, host_path=h, read_only=ro)
            for c, h, ro in allocation.mounts
        ],
        cdi_devices=[api_pb2.CDIDevice(name=n) for n in allocation.cdi_devices],
    )


class DevicePluginService(api_pb2_grpc.DevicePluginServicer):
    """Each RPC a few lines: the decisions live in `devices.py` and `allocation.py`."""

    def __init__(self, inventory: LiveInventory, allocator: Allocator, metrics: Metrics) -> None:
        self.inventory = inventory
        self.allocator = allocator
        self.metrics = metrics
        self.stopping = threading.Event()
        self.streams = 0
        """ListAndWatch streams of this serving open now (the kubelet keeps one per
        registration)."""
        self.stream_ended: Callable[[], None] = lambda: None
        """Called when the kubelet ends a stream of this serving while it serves."""
        self._serving = 0
        """Which start of the server this is: a stream of an earlier one counts for nothing."""
        self._streams_lock = threading.Lock()

    def serve_anew(self) -> None:
        """The server starts (again): no stream is open, and earlier ones are forgotten."""
        with self._streams_lock:
            self._serving += 1
            self.streams = 0
        self.stopping.clear()

    def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)

    def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> Iterator[api_pb2.ListAndWatchResponse]:
        context.add_callback(self.inventory.wake)
        with self._streams_lock:
            serving = self._serving
            self.streams += 1
        try:
            version, inventory = self.inventory.snapshot()
            yield list_response(inventory)

            def done() -> bool:
                return self.stopping.is_set() or not context.is_active()

            while not done():
                update = self.inventory.wait_newer(version, done, _STREAM_RECHECK_S)
                if update is not None:
                    version, inventory = update
                    yield list_response(inventory)
        finally:
            with self._streams_lock:
                current = serving == self._serving
                if current:
                    self.streams -= 1
            if current and not self.stopping.is_set():
                self.stream_ended()

    def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        answers = []
        for req in request.container_requests:
            try:
                ids = self.allocator.preferred(
                    list(req.available_deviceIDs),
                    list(req.must_include_deviceIDs),
                    req.allocation_size,
                )
            except ValueError as err:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            answers.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return api_pb2.PreferredAllocationResponse(container_responses=answers)

    def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocateResponse:
        started = time.perf_counter()
        answers = []
        try:
            for req in request.container_requests:
                answers.append(container_response(self.allocator.allocate(list(req.devices_ids))))
        except ValueError as err:  # the only way Allocate fails: device IDs not of ours
            self.metrics.allocations.labels(outcome="bad-request").inc()
            log.error("Allocate refused: %s", err)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"baton device plugin: {err}")
        finally:
            self.metrics.allocate_seconds.observe(time.perf_counter() - started)
        self.metrics.allocations.labels(outcome="ok").inc()
        return api_pb2.AllocateResponse(container_responses=answers)

    def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()


class PluginServer:
    """A gRPC server for one DevicePluginService on a unix socket; start, stop, start again."""

    def __init__(self, service: DevicePluginService, socket_path: Path) -> None:
        self.service = service
        self.socket_path = socket_path
        self._server: grpc.Server | None = None
        self._socket = ServedSocket(socket_path)

    def start(self) -> None:
        """Serve, put the socket in place of any there (a stale one), and check that it accepts
        connections."""
        self.service.serve_anew()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="dp"))
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.service, server)
        self._socket = served = ServedSocket(self.socket_path)
        try:
            server.add_insecure_port(served.address)
        except RuntimeError:  # gRPC says only that it failed: a plain bind says why
            raise OSError(
                f"cannot bind plugin socket {self.socket_path}: {served.bind_error()}"
            ) from None
        server.start()
        self._server = server
        try:
            served.publish()
        except OSError as err:
            self.stop()
            raise OSError(
                f"cannot serve plugin socket {self.socket_path}: {err.strerror or err}"
            ) from None
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(READY_TIMEOUT_S)
            try:
                probe.connect(str(self.socket_path))
            except OSError as err:
                self.stop()
                raise OSError(f"plugin socket {self.socket_path} does not answer: {err}") from err

    def stop(self, grace: float | None = None) -> None:
        """End every stream, stop serving, and remove the socket while it is still its own (not
        one another plugin put in its place).

        Calls in flight (Allocate) get `grace` seconds to finish; None cancels them at once.
        """
        self.service.stopping.set()
        self.service.inventory.wake()
        if self._server is not None:
            self._server.stop(grace=grace).wait((grace or 0) + READY_TIMEOUT_S)
            self._server = None
        self._socket.remove()

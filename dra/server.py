"""The driver's two unix-socket gRPC servers: its endpoint and its registration socket.

The kubelet watches `plugins_registry/`; it finds `<driver>-reg.sock` there, asks GetInfo, dials
the endpoint it names (`plugins/<driver>/dra.sock`), and registers. Removing the registration
socket deregisters.
"""

from __future__ import annotations

import socket
from concurrent import futures
from pathlib import Path

import grpc

from baton._pb import (
    dra_pb2_grpc,
    drahealth_pb2_grpc,
    drav1beta1_pb2_grpc,
    pluginregistration_pb2_grpc,
)
from baton.contract import names
from baton.contract.unixsocket import ServedSocket
from dra.service import (
    DraPluginService,
    DraPluginV1beta1Service,
    HealthService,
    RegistrationService,
)

READY_TIMEOUT_S = 5.0


def endpoint_path(plugins_dir: Path) -> Path:
    """The socket the kubelet calls the driver on."""
    return plugins_dir / names.DRA_DRIVER / "dra.sock"


def registration_path(registry_dir: Path) -> Path:
    """The socket the kubelet's plugin watcher finds."""
    return registry_dir / f"{names.DRA_DRIVER}-reg.sock"


def _serve(
    path: Path, add: list[tuple[object, object]], workers: int
) -> tuple[grpc.Server, ServedSocket]:
    """Serve on `path`, in place of any socket there (a stale one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dra"))
    for adder, servicer in add:
        adder(servicer, server)  # type: ignore[operator]
    served = ServedSocket(path)
    try:
        server.add_insecure_port(served.address)
    except RuntimeError:  # gRPC says only that it failed: a plain bind says why
        raise OSError(f"cannot bind socket {path}: {served.bind_error()}") from None
    server.start()
    try:
        served.publish()
    except OSError as err:  # e.g. a directory in its place
        server.stop(None)
        raise OSError(f"cannot serve socket {path}: {err.strerror or err}") from None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(READY_TIMEOUT_S)
        try:
            probe.connect(str(path))
        except OSError as err:
            server.stop(None)
            served.remove()
            raise OSError(f"socket {path} does not answer: {err}") from err
    return server, served


class DriverServer:
    """Serves the endpoint first, then the registration socket (so the kubelet can dial at once)."""

    def __init__(
        self,
        plugin: DraPluginService,
        health: HealthService,
        registration: RegistrationService,
        endpoint: Path,
        registration_socket: Path,
    ) -> None:
        self.plugin = plugin
        self.health = health
        self.registration = registration
        self.endpoint = endpoint
        self.registration_socket = registration_socket
        self._servers: list[tuple[grpc.Server, ServedSocket]] = []

    def start(self) -> None:
        """Serve both sockets."""
        self.health.stopping.clear()
        self._servers.append(
            _serve(
                self.endpoint,
                [
                    (dra_pb2_grpc.add_DRAPluginServicer_to_server, self.plugin),
                    (
                        drav1beta1_pb2_grpc.add_DRAPluginServicer_to_server,
                        DraPluginV1beta1Service(self.plugin),
                    ),
                    (drahealth_pb2_grpc.add_DRAResourceHealthServicer_to_server, self.health),
                ],
                16,
            )
        )
        self._servers.append(
            _serve(
                self.registration_socket,
                [
                    (
                        pluginregistration_pb2_grpc.add_RegistrationServicer_to_server,
                        self.registration,
                    )
                ],
                2,
            )
        )

    def stop(self, grace: float | None = None) -> None:
        """Deregister (registration socket first), end health streams, stop, and remove the
        sockets while they are still its own (not those of a driver started since)."""
        self.health.stopping.set()
        self.health.inventory.wake()
        for server, served in reversed(self._servers):
            server.stop(grace).wait((grace or 0) + READY_TIMEOUT_S)
            served.remove()
        self._servers.clear()

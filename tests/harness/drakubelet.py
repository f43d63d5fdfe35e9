"""A kubelet stand-in for DRA driver tests, shaped like the device-plugin stub: one type per role.

`DraKubeletStub` does what the kubelet's plugin manager and DRA manager do with a driver: find
its registration socket, GetInfo, check the plugin type and versions, dial the endpoint,
NotifyRegistrationStatus, open the health stream at once (every report recorded), and call
NodePrepareResources / NodeUnprepareResources in the DRAPlugin version it is made for (v1, as
kubelets since 1.34 speak it; v1beta1, as older ones do).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import grpc

from baton._pb import (
    dra_pb2,
    dra_pb2_grpc,
    drahealth_pb2,
    drahealth_pb2_grpc,
    drav1beta1_pb2,
    drav1beta1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)

DIAL_TIMEOUT_S = 10.0
APIS: dict[str, tuple[Any, Any]] = {
    "v1": (dra_pb2, dra_pb2_grpc),
    "v1beta1": (drav1beta1_pb2, drav1beta1_pb2_grpc),
}
"""The DRAPlugin versions the stub can speak: their messages and stubs."""


class DraKubeletStub:
    """The kubelet's side of one DRA driver."""

    def __init__(self, registry_dir: Path, version: str = "v1") -> None:
        self.registry_dir = registry_dir
        self.wanted = f"{version}.DRAPlugin"
        self._messages, self._stubs = APIS[version]
        self.info: pluginregistration_pb2.PluginInfo | None = None
        self.health_reports: list[drahealth_pb2.NodeWatchResourcesResponse] = []
        self._reported = threading.Condition()
        self._channel: grpc.Channel | None = None
        self._stream: grpc.Future | None = None
        self._thread: threading.Thread | None = None

    def register(self) -> pluginregistration_pb2.PluginInfo:
        """Find the driver's registration socket and register it, as the plugin watcher does."""
        sockets = sorted(self.registry_dir.glob("*-reg.sock"))
        assert len(sockets) == 1, f"expected one registration socket, found {sockets}"
        with grpc.insecure_channel(f"unix://{sockets[0]}") as reg:
            grpc.channel_ready_future(reg).result(timeout=DIAL_TIMEOUT_S)
            stub = pluginregistration_pb2_grpc.RegistrationStub(reg)
            info = stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=DIAL_TIMEOUT_S)
            error = self._validate(info)
            stub.NotifyRegistrationStatus(
                pluginregistration_pb2.RegistrationStatus(plugin_registered=not error, error=error),
                timeout=DIAL_TIMEOUT_S,
            )
        assert not error, error
        self.info = info
        self.close()
        self._channel = grpc.insecure_channel(f"unix://{info.endpoint}")
        grpc.channel_ready_future(self._channel).result(timeout=DIAL_TIMEOUT_S)
        self._thread = threading.Thread(target=self._watch_health, daemon=True)
        self._thread.start()
        return info

    def _validate(self, info: pluginregistration_pb2.PluginInfo) -> str:
        if info.type != "DRAPlugin":
            return f"plugin type {info.type!r} is not DRAPlugin"
        if self.wanted not in info.supported_versions:
            return f"none of {list(info.supported_versions)} is {self.wanted}"
        if not Path(info.endpoint).is_socket():
            return f"endpoint {info.endpoint} is not a socket"
        return ""

    def _watch_health(self) -> None:
        assert self._channel is not None
        stub = drahealth_pb2_grpc.DRAResourceHealthStub(self._channel)
        stream = stub.NodeWatchResources(drahealth_pb2.NodeWatchResourcesRequest())
        self._stream = stream
        try:
            for report in stream:
                with self._reported:
                    self.health_reports.append(report)
                    self._reported.notify_all()
        except grpc.RpcError:
            return

    def wait_health(self, count: int, timeout: float = DIAL_TIMEOUT_S) -> bool:
        """Whether at least `count` health reports came within `timeout`."""
        with self._reported:
            return self._reported.wait_for(lambda: len(self.health_reports) >= count, timeout)

    def prepare(self, *claims: tuple[str, str, str], timeout: float = DIAL_TIMEOUT_S) -> Any:
        """NodePrepareResources for (namespace, uid, name) claims, in the stub's version, with
        the call's deadline `timeout` seconds away (the kubelet's is 45 s)."""
        assert self._channel is not None
        return self._stubs.DRAPluginStub(self._channel).NodePrepareResources(
            self._messages.NodePrepareResourcesRequest(claims=self._claims(claims)),
            timeout=timeout,
        )

    def unprepare(self, *claims: tuple[str, str, str]) -> Any:
        """NodeUnprepareResources for (namespace, uid, name) claims, in the stub's version."""
        assert self._channel is not None
        return self._stubs.DRAPluginStub(self._channel).NodeUnprepareResources(
            self._messages.NodeUnprepareResourcesRequest(claims=self._claims(claims)),
            timeout=DIAL_TIMEOUT_S,
        )

    def _claims(self, claims: tuple[tuple[str, str, str], ...]) -> list[Any]:
        return [self._messages.Claim(namespace=n, uid=u, name=m) for n, u, m in claims]

    def close(self) -> None:
        """Drop the connection (a kubelet restart does)."""
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self._thread is not None:
            self._thread.join(timeout=DIAL_TIMEOUT_S)
            self._thread = None

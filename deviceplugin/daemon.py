"""Wiring: build every part of `baton deviceplugin` from its settings, start and stop them."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from baton.contract import names, shutdown
from baton.contract.unixsocket import length_problem
from deviceplugin.allocation import Allocator, PodSource
from deviceplugin.errors import DevicePluginStartError
from deviceplugin.plugin import DevicePlugin
from deviceplugin.podcache import PodCache
from deviceplugin.podresources import PodResourcesClient
from deviceplugin.reconcile import DEFAULT_INTERVAL_S, Reconciler
from deviceplugin.server import DevicePluginService, PluginServer
from nodegpu.inventory import NodeGpu
from nodegpu.node import NodeGpus, NodeSettings, NodeStartError

log = logging.getLogger(__name__)
CDI_KIND = "nvidia.com/gpu"
SYNC_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Settings(NodeSettings):
    """Everything `baton deviceplugin` is told on its command line: the node's, then its own."""

    metrics_port: int = names.PORT_DEVICE_PLUGIN
    plugin_dir: Path = Path(names.KUBELET_DEVICE_PLUGIN_DIR)
    cdi: bool = False
    socket_name: str = names.DEVICE_PLUGIN_SOCKET_NAME
    pod_resources_socket: Path | None = Path(names.KUBELET_POD_RESOURCES_SOCKET)
    """The kubelet's PodResources API; None: no reconciliation (Allocate still answers)."""
    reconcile_interval_s: float = DEFAULT_INTERVAL_S


class Daemon:
    """The running device plugin: gRPC server + registration and pod reconciliation, over the
    node layer (inventory, health, annotations, metrics)."""

    def __init__(
        self,
        settings: Settings,
        gpus: list[NodeGpu],
        fake: bool,
        api_client: Any = None,
        source: PodSource | None = None,
        stop: shutdown.StopSignal | None = None,
    ) -> None:
        """Pods come from `source` when given, else from a watch through `api_client`;
        `DevicePluginStartError` before anything is made where the plugin's socket path is too
        long to bind, or the kubelet's PodResources socket too long to connect to. A `stop`
        signal that comes while `start` waits for the pods ends the start there: nothing is
        served, nor registered with the kubelet."""
        _short_enough(
            settings.plugin_dir / settings.socket_name,
            "--device-plugin-dir (BATON_DEVICE_PLUGIN_DIR)",
        )
        if settings.pod_resources_socket is not None:
            _short_enough(
                settings.pod_resources_socket,
                "--pod-resources-socket (BATON_POD_RESOURCES_SOCKET)",
                served=False,
            )
        self.settings = settings
        self._stop_signal = stop
        self.pod_cache: PodCache | None = None
        if source is None:
            if api_client is None:
                raise ValueError("the device plugin needs an API client or a pod source")
            self.pod_cache = PodCache(api_client, settings.node_name)
            source = self.pod_cache
        try:
            self.node = NodeGpus(settings, gpus, fake, api_client, self.not_ready)
        except NodeStartError as err:
            raise DevicePluginStartError(str(err)) from None
        self.metrics = self.node.metrics
        self.inventory = self.node.inventory
        self.health = self.node.health
        self.status = self.node.status
        self.pod_resources: PodResourcesClient | None = None
        self.reconciler: Reconciler | None = None
        if settings.pod_resources_socket is not None:
            self.pod_resources = PodResourcesClient(settings.pod_resources_socket)
            self.reconciler = Reconciler(
                self.pod_resources,
                source,
                self.metrics,
                settings.node_name,
                settings.reconcile_interval_s,
            )
        self.allocator = Allocator(
            source,
            self.inventory,
            settings.node_name,
            CDI_KIND if settings.cdi else None,
            self.reconciler.poke if self.reconciler is not None else lambda: None,
        )
        service = DevicePluginService(self.inventory, self.allocator, self.metrics)
        server = PluginServer(service, settings.plugin_dir / settings.socket_name)
        self.plugin = DevicePlugin(server, settings.plugin_dir, self.metrics)

    def not_ready(self) -> str | None:
        """Why the plugin cannot serve the kubelet yet, or None when it can."""
        if not self.plugin.registered:
            return f"not registered with the kubelet in {self.settings.plugin_dir}"
        if self.pod_cache is not None and not self.pod_cache.wait_synced(0):
            return f"pods of node {self.settings.node_name} not listed yet"
        return None

    def start(self) -> None:
        """Start the node layer (metrics, health, annotations), then serve and register."""
        self.node.start()
        if self.pod_cache is not None:
            self.pod_cache.start()
            if not self._pods_listed(self.pod_cache):
                if self._stop_signal is not None and self._stop_signal.event.is_set():
                    return  # told to stop while it waited: serve and register nothing
                log.warning(
                    "pods of node %s not listed within %g s; serving anyway: Allocate still "
                    "answers (it needs no pods), and GetPreferredAllocation lists them itself "
                    "until then",
                    self.settings.node_name,
                    SYNC_TIMEOUT_S,
                )
        if self.reconciler is not None:
            self.reconciler.start()
        self.plugin.start()
        log.info(
            "%s %d slot devices of %s on %s%s; metrics on :%d",
            "serving" if self.plugin.serving else "will serve",
            len(self.inventory.snapshot()[1].devices()),
            names.RESOURCE_GPU,
            self.plugin.server.socket_path,
            "" if self.plugin.serving else " once the kubelet creates its directory",
            self.status.port,
        )

    def _pods_listed(self, cache: PodCache) -> bool:
        """Whether `cache` listed the pods within `SYNC_TIMEOUT_S`; a stop signal ends the wait."""
        woken = threading.Event()
        cache.also_wake(woken)
        if self._stop_signal is not None:
            self._stop_signal.also_wake(woken)
        woken.wait(SYNC_TIMEOUT_S)
        return cache.wait_synced(0)

    def stop(self) -> None:
        """Stop everything started."""
        parts: list[tuple[str, Callable[[], object]]] = [
            ("the plugin server", lambda: self.plugin.stop(self.settings.shutdown_grace))
        ]
        if self.reconciler is not None:
            parts.append(("the reconciler", self.reconciler.stop))
        if self.pod_resources is not None:
            parts.append(("the PodResources client", self.pod_resources.close))
        if self.pod_cache is not None:
            parts.append(("the pod watch", self.pod_cache.stop))
        parts.append(("the node layer", self.node.stop))
        shutdown.stop_parts("device plugin", parts)

    def run_until(
        self, stop: threading.Event, why: Callable[[], str | None] = lambda: None
    ) -> None:
        """Start, block until `stop` is set, stop; log `why()` it stopped."""
        shutdown.run_until(self.start, self.stop, stop)
        log.info(
            "device plugin stopped on %s; the kubelet drops its registration on its own",
            why() or "request",
        )


def _short_enough(socket: Path, flag: str, served: bool = True) -> None:
    """`DevicePluginStartError` naming `flag` where `socket` is too long to bind (`served`) or
    to connect to."""
    too_long = length_problem(socket, served=served)
    if too_long:
        raise DevicePluginStartError(f"{too_long}: pass a shorter {flag}")

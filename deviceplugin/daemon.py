"""Wiring: build every part of `baton deviceplugin` from its settings, start and stop them."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from baton.contract import names, shutdown
from deviceplugin.allocation import Allocator, PodSource
from deviceplugin.annotate import NodeAnnotator
from deviceplugin.devices import Inventory, NodeGpu
from deviceplugin.errors import DevicePluginStartError
from deviceplugin.health import HealthTracker, NvmlHealthLoop
from deviceplugin.metrics import Metrics, StatusServer
from deviceplugin.plugin import DevicePlugin
from deviceplugin.podcache import PodCache
from deviceplugin.podresources import PodResourcesClient
from deviceplugin.reconcile import DEFAULT_INTERVAL_S, Reconciler
from deviceplugin.server import DevicePluginService, PluginServer
from deviceplugin.state import LiveInventory

log = logging.getLogger(__name__)
CDI_KIND = "nvidia.com/gpu"
SYNC_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Settings:
    """Everything `baton deviceplugin` is told on its command line."""

    node_name: str
    plugin_dir: Path = Path(names.KUBELET_DEVICE_PLUGIN_DIR)
    slots_per_gpu: int = names.DEFAULT_SLOTS_PER_GPU
    host_memory_budget_mib: int = 0
    cdi: bool = False
    metrics_host: str = "0.0.0.0"
    metrics_port: int = names.PORT_DEVICE_PLUGIN
    ignored_xids: frozenset[int] = frozenset()
    socket_name: str = names.DEVICE_PLUGIN_SOCKET_NAME
    shutdown_grace: float | None = None
    """Seconds an in-flight Allocate gets on stop; None cancels it at once."""
    pod_resources_socket: Path | None = Path(names.KUBELET_POD_RESOURCES_SOCKET)
    """The kubelet's PodResources API; None: no reconciliation (Allocate still answers)."""
    reconcile_interval_s: float = DEFAULT_INTERVAL_S


class Daemon:
    """The running device plugin: gRPC server + registration, health, annotations, metrics."""

    def __init__(
        self,
        settings: Settings,
        gpus: list[NodeGpu],
        fake: bool,
        api_client: Any = None,
        source: PodSource | None = None,
    ) -> None:
        """Pods come from `source` when given, else from a watch through `api_client`."""
        self.settings = settings
        self.pod_cache: PodCache | None = None
        if source is None:
            if api_client is None:
                raise ValueError("the device plugin needs an API client or a pod source")
            self.pod_cache = PodCache(api_client, settings.node_name)
            source = self.pod_cache
        self.metrics = Metrics()
        self.inventory = LiveInventory(Inventory(tuple(gpus), settings.slots_per_gpu))
        self.inventory.subscribe(self.metrics.observe_inventory)
        self.metrics.observe_inventory(self.inventory.snapshot()[1])
        self.health = HealthTracker(self.inventory, settings.ignored_xids)
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
        try:
            self.status = StatusServer(
                settings.metrics_host,
                settings.metrics_port,
                self.metrics,
                self.health if fake else None,
                self.not_ready,
            )
        except OSError as err:
            raise DevicePluginStartError(
                f"cannot serve metrics on {settings.metrics_host}:{settings.metrics_port} "
                f"({err.strerror}); pass another --metrics-port"
            ) from None
        self.nvml = None if fake else NvmlHealthLoop(self.health)
        self.annotator = (
            NodeAnnotator(
                api_client, settings.node_name, self.inventory, settings.host_memory_budget_mib
            )
            if api_client is not None
            else None
        )

    def not_ready(self) -> str | None:
        """Why the plugin cannot serve the kubelet yet, or None when it can."""
        if not self.plugin.registered:
            return f"not registered with the kubelet in {self.settings.plugin_dir}"
        if self.pod_cache is not None and not self.pod_cache.wait_synced(0):
            return f"pods of node {self.settings.node_name} not listed yet"
        return None

    def start(self) -> None:
        """Start metrics, health, annotations, then serve and register."""
        self.status.start()
        if self.pod_cache is not None:
            self.pod_cache.start()
            if not self.pod_cache.wait_synced(SYNC_TIMEOUT_S):
                log.warning(
                    "pods of node %s not listed within %g s; Allocate lists on demand until then",
                    self.settings.node_name,
                    SYNC_TIMEOUT_S,
                )
        if self.nvml is not None:
            self.nvml.start()
        if self.annotator is not None:
            self.annotator.start()
        if self.reconciler is not None:
            self.reconciler.start()
        self.plugin.start()
        log.info(
            "serving %d slot devices of %s on %s; metrics on :%d",
            len(self.inventory.snapshot()[1].devices()),
            names.RESOURCE_GPU,
            self.plugin.server.socket_path,
            self.status.port,
        )

    def stop(self) -> None:
        """Stop everything started."""
        self.plugin.stop(self.settings.shutdown_grace)
        if self.reconciler is not None:
            self.reconciler.stop()
        if self.pod_resources is not None:
            self.pod_resources.close()
        if self.pod_cache is not None:
            self.pod_cache.stop()
        if self.annotator is not None:
            self.annotator.stop()
        if self.nvml is not None:
            self.nvml.stop()
        self.status.stop()

    def run_until(
        self, stop: threading.Event, why: Callable[[], str | None] = lambda: None
    ) -> None:
        """Start, block until `stop` is set, stop; log `why()` it stopped."""
        shutdown.run_until(self.start, self.stop, stop)
        log.info(
            "device plugin stopped on %s; the kubelet drops its registration on its own",
            why() or "request",
        )

"""Wiring: build every part of `baton dra` from its settings, start and stop them."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from baton.contract import names, shutdown
from deviceplugin.annotate import NodeAnnotator
from deviceplugin.devices import Inventory, NodeGpu
from deviceplugin.health import HealthTracker, NvmlHealthLoop
from deviceplugin.metrics import Metrics, StatusServer
from deviceplugin.state import LiveInventory
from dra import runtime
from dra.faults import PrepareHold
from dra.kubeapi import KubeDraApi
from dra.prepare import ClaimReader, Preparer
from dra.publisher import SliceApi, SlicePublisher
from dra.record import ClaimRecord
from dra.server import DriverServer, endpoint_path, registration_path
from dra.service import DraPluginService, HealthService, RegistrationService

log = logging.getLogger(__name__)


class DraStartError(Exception):
    """Something the driver needs at start is unusable; the message says what."""


@dataclass(frozen=True)
class Settings:
    """Everything `baton dra` is told on its command line."""

    node_name: str
    plugins_dir: Path = Path(names.KUBELET_PLUGINS_DIR)
    registry_dir: Path = Path(names.KUBELET_PLUGINS_REGISTRY_DIR)
    cdi_dir: Path = Path(names.CDI_SPEC_DIR)
    state_dir: Path = Path(names.DRA_STATE_DIR)
    slots_per_gpu: int = names.DEFAULT_SLOTS_PER_GPU
    host_memory_budget_mib: int = 0
    vendor_cdi: str | None = None
    """A vendor CDI kind (`nvidia.com/gpu`) whose `<kind>=<uuid>` IDs are returned too."""
    runtime_cdi: str = runtime.AUTO
    metrics_host: str = "0.0.0.0"
    metrics_port: int = names.PORT_DRA
    ignored_xids: frozenset[int] = frozenset()
    shutdown_grace: float | None = None


class Driver:
    """The running DRA driver: kubelet sockets, ResourceSlice, health, node annotations."""

    def __init__(
        self,
        settings: Settings,
        gpus: list[NodeGpu],
        fake: bool,
        api: KubeDraApi | None = None,
        slices: SliceApi | None = None,
        claims: ClaimReader | None = None,
        api_client: Any = None,
    ) -> None:
        """`api` serves slices, claims and the node; tests pass `slices`/`claims` instead."""
        self.settings = settings
        self.api = api
        self.inventory = LiveInventory(Inventory(tuple(gpus), settings.slots_per_gpu))
        self.health = HealthTracker(self.inventory, settings.ignored_xids)
        self.metrics = Metrics()
        self.inventory.subscribe(self.metrics.observe_inventory)
        self.metrics.observe_inventory(self.inventory.snapshot()[1])
        self._node: dict[str, Any] = {}
        self.record = ClaimRecord(settings.state_dir)
        self.hold = PrepareHold() if fake else None
        self.preparer = Preparer(
            settings.node_name,
            self.inventory,
            claims or api,  # type: ignore[arg-type]
            self.record,
            settings.cdi_dir,
            settings.vendor_cdi,
            self.cdi_refusal,
            self.hold or (lambda uid: None),
        )
        self.publisher = SlicePublisher(
            slices or api,  # type: ignore[arg-type]
            settings.node_name,
            self.inventory,
            lambda: str((self._node.get("metadata") or {}).get("uid", "")),
        )
        endpoint = endpoint_path(settings.plugins_dir)
        self.registration = RegistrationService(str(endpoint), self.publisher.poke)
        self.server = DriverServer(
            DraPluginService(self.preparer),
            HealthService(settings.node_name, self.inventory),
            self.registration,
            endpoint,
            registration_path(settings.registry_dir),
        )
        self.nvml = None if fake else NvmlHealthLoop(self.health)
        self.annotator = (
            NodeAnnotator(
                api_client, settings.node_name, self.inventory, settings.host_memory_budget_mib
            )
            if api_client is not None
            else None
        )
        try:
            self.status = StatusServer(
                settings.metrics_host,
                settings.metrics_port,
                self.metrics,
                self.health if fake else None,
                self.not_ready,
                {"/fake/hold-prepare": self.hold.arm} if self.hold else None,
            )
        except OSError as err:
            raise DraStartError(
                f"cannot serve metrics on {settings.metrics_host}:{settings.metrics_port} "
                f"({err.strerror}); pass another --metrics-port"
            ) from None

    def cdi_refusal(self) -> str | None:
        """Why this node's runtime cannot apply the CDI specs, or None."""
        version = ((self._node.get("status") or {}).get("nodeInfo") or {}).get(
            "containerRuntimeVersion", ""
        )
        if not version and self.settings.runtime_cdi == runtime.AUTO:
            return "the node's container runtime is not known yet (node not read)"
        return runtime.cdi_refusal(version, self.settings.runtime_cdi)

    def not_ready(self) -> str | None:
        """Why the driver cannot serve yet, or None."""
        if not self.registration.count:
            return f"not registered with the kubelet through {self.settings.registry_dir}"
        if not self.publisher.published.is_set():
            return "ResourceSlice not published yet"
        return None

    def start(self) -> None:
        """Read the node, clean orphaned specs, then serve and register."""
        if self.api is not None:
            try:
                self._node = self.api.node()
            except Exception as err:  # the runtime check then refuses with this reason
                log.error("cannot read node %s (%s)", self.settings.node_name, err)
        why = self.cdi_refusal()
        if why:
            log.error("claims will not be prepared on this node: %s", why)
        self.preparer.remove_orphans()
        self.status.start()
        if self.nvml is not None:
            self.nvml.start()
        if self.annotator is not None:
            self.annotator.start()
        self.publisher.start()
        self.server.start()
        log.info(
            "DRA driver %s serving %d GPUs on %s; metrics on :%d",
            names.DRA_DRIVER,
            len(self.inventory.snapshot()[1].gpus),
            self.server.endpoint,
            self.status.port,
        )

    def stop(self) -> None:
        """Stop everything started (the record and specs stay for the next start)."""
        if self.hold is not None:
            self.hold.stop()
        self.server.stop(self.settings.shutdown_grace)
        self.publisher.stop()
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
        log.info("DRA driver stopped on %s", why() or "request")

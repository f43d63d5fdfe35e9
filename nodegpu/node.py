"""The node layer as one object: built from one settings type, started and stopped as one.

Both kubelet-facing daemons (`deviceplugin`, `dra`) hold a `NodeGpus` and add only what faces
the kubelet; a new cluster-facing path plugs into it the same way.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from baton.contract import names
from nodegpu.annotate import NodeAnnotator
from nodegpu.health import HealthTracker, NvmlHealthLoop
from nodegpu.inventory import Inventory, NodeGpu
from nodegpu.metrics import FakePost, Metrics, StatusServer
from nodegpu.state import LiveInventory

log = logging.getLogger(__name__)


class NodeStartError(Exception):
    """Something the node layer needs at start (its metrics port) is unusable; says what."""


@dataclass(frozen=True)
class NodeSettings:
    """What every node daemon is told about its node, its GPUs and its status server."""

    node_name: str
    slots_per_gpu: int = names.DEFAULT_SLOTS_PER_GPU
    host_memory_budget_mib: int = 0
    metrics_host: str = "0.0.0.0"
    metrics_port: int = 0
    ignored_xids: frozenset[int] = frozenset()
    shutdown_grace: float | None = None
    """Seconds an in-flight kubelet call gets on stop; None cancels it at once."""


def node_fields(settings: NodeSettings) -> dict[str, Any]:
    """The node settings as keywords, to build a daemon's settings (which extend them)."""
    return {f.name: getattr(settings, f.name) for f in dataclasses.fields(NodeSettings)}


class NodeGpus:
    """The node's GPUs, live: inventory, health (NVML XIDs or the fake faults), the node
    annotations, metrics and the status server (`/metrics`, `/healthz`, `/readyz`)."""

    def __init__(
        self,
        settings: NodeSettings,
        gpus: Iterable[NodeGpu],
        fake: bool,
        api_client: Any,
        not_ready: Callable[[], str | None],
        fake_posts: Mapping[str, FakePost] | None = None,
    ) -> None:
        """Annotations need `api_client` (None: none written); `not_ready` answers `/readyz`
        (then the GPU health watch's problem); `fake_posts` are the daemon's own fault routes,
        served with fake GPUs only."""
        self.settings = settings
        self.metrics = Metrics()
        self.inventory = LiveInventory(Inventory(tuple(gpus), settings.slots_per_gpu))
        self.inventory.subscribe(self.metrics.observe_inventory)
        self.metrics.observe_inventory(self.inventory.snapshot()[1])
        self.health = HealthTracker(self.inventory, settings.ignored_xids)
        self.nvml = None
        if not fake:
            self.nvml = NvmlHealthLoop(self.health, self.metrics.health_watch_failures.inc)
            self.metrics.unwatched_gpus.set_function(self.nvml.unwatched)
        try:
            self.status = StatusServer(
                settings.metrics_host,
                settings.metrics_port,
                self.metrics,
                self.health if fake else None,
                lambda: not_ready() or self.health_problem(),
                fake_posts if fake else None,
            )
        except OSError as err:
            host_wrong = isinstance(err, socket.gaierror) or err.errno == errno.EADDRNOTAVAIL
            raise NodeStartError(
                f"cannot serve metrics on {settings.metrics_host}:{settings.metrics_port} "
                f"({err.strerror}); pass "
                + ("a --metrics-host of this machine" if host_wrong else "another --metrics-port")
            ) from None
        self.annotator = (
            NodeAnnotator(
                api_client, settings.node_name, self.inventory, settings.host_memory_budget_mib
            )
            if api_client is not None
            else None
        )

    def health_problem(self) -> str | None:
        """Why some GPU's health is not watched now (`/readyz` says it), or None."""
        return self.nvml.problem() if self.nvml is not None else None

    def start(self) -> None:
        """Serve the status, watch health, write the annotations."""
        self.status.start()
        if self.nvml is not None:
            self.nvml.start()
        if self.annotator is not None:
            self.annotator.start()

    def stop(self) -> None:
        """Stop everything `start` started."""
        if self.annotator is not None:
            self.annotator.stop()
        if self.nvml is not None:
            self.nvml.stop()
        self.status.stop()

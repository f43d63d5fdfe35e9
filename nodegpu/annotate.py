"""The node annotations the extender reads: GPU inventory and host DRAM budget, kept current."""

from __future__ import annotations

import logging
from typing import Any

from baton.contract.annotations import node_annotations as annotations_of_node
from baton.contract.kube import Outage
from baton.contract.meminfo import mem_total_kib
from nodegpu.inventory import Inventory
from nodegpu.republish import Republisher
from nodegpu.state import LiveInventory

log = logging.getLogger(__name__)
DEFAULT_HOST_MEMORY_BUDGET = "50%"


def node_annotations(inventory: Inventory, budget_mib: int) -> dict[str, str]:
    """`baton.dev/gpus` and `baton.dev/host-memory-budget` (`baton.contract.annotations`)."""
    return annotations_of_node(inventory.records(), budget_mib)


def host_memory_budget_mib(spec: str, meminfo: str) -> int:
    """MiB from `65536` (MiB) or `50%` (of MemTotal in /proc/meminfo's text)."""
    spec = spec.strip()
    unreadable = f"--host-memory-budget {spec!r}: give MiB (65536) or a share (50%)"
    if not spec.endswith("%"):
        try:
            mib = int(spec)
        except ValueError:
            raise ValueError(unreadable) from None
        if mib < 0:
            raise ValueError(f"--host-memory-budget {spec!r}: MiB must be 0 or more")
        return mib
    try:
        share = float(spec[:-1])
    except ValueError:
        raise ValueError(unreadable) from None
    if not 0 < share <= 100:
        raise ValueError(f"--host-memory-budget {spec!r}: the share must be within (0, 100]%")
    return int(mem_total_kib(meminfo) / 1024 * share / 100)


class NodeAnnotator:
    """Patches the node's annotations at start and after every inventory change."""

    def __init__(self, api_client: Any, node_name: str, inventory: LiveInventory, budget_mib: int):
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)
        self.node_name = node_name
        self.inventory = inventory
        self.budget_mib = budget_mib
        outage = Outage(
            log,
            f"annotating node {node_name}",
            "the extender does not see this node's GPUs and host budget, or sees old ones",
        )
        self.republisher = Republisher("node-annotator", self._publish, outage, 0.2)
        inventory.subscribe(lambda _inventory: self.republisher.poke())

    def start(self) -> None:
        """Publish now and keep publishing on changes."""
        self.republisher.start()

    def stop(self) -> None:
        """Stop publishing."""
        self.republisher.stop()

    def _publish(self) -> None:
        _, inventory = self.inventory.snapshot()
        body = {"metadata": {"annotations": node_annotations(inventory, self.budget_mib)}}
        self._core.patch_node(self.node_name, body, _request_timeout=5)

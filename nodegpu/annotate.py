"""The node annotations the extender reads: GPU inventory and host DRAM budget, kept current."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from baton.contract.annotations import AnnotationError, decode_budget, decode_gpus
from baton.contract.annotations import node_annotations as annotations_of_node
from baton.contract.kube import Outage
from baton.contract.meminfo import mem_total_kib
from baton.contract.names import ANNOTATION_GPUS, ANNOTATION_HOST_MEMORY_BUDGET
from nodegpu.inventory import Inventory
from nodegpu.republish import Republisher
from nodegpu.state import LiveInventory

log = logging.getLogger(__name__)
DEFAULT_HOST_MEMORY_BUDGET = "50%"
RESYNC_S = 10.0
"""Seconds between checks that the node still carries the annotations: a node deleted and
registered again under its name has none, and someone else may remove or overwrite them."""


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


def same_annotations(found: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    """Whether the node's annotations say what `wanted` says (read, not compared as text)."""
    if any(key not in found for key in wanted):
        return False
    budget = ANNOTATION_HOST_MEMORY_BUDGET
    try:
        same_gpus = decode_gpus(found[ANNOTATION_GPUS]) == decode_gpus(wanted[ANNOTATION_GPUS])
        return same_gpus and decode_budget(found[budget]) == decode_budget(wanted[budget])
    except AnnotationError:
        return False


def annotate_once(core: Any, node_name: str, wanted: Mapping[str, str]) -> str:
    """Patch the node's annotations unless it carries them already; "written" or "unchanged"."""
    node = core.read_node(node_name, _request_timeout=5)
    if same_annotations(node.metadata.annotations or {}, wanted):
        return "unchanged"
    core.patch_node(node_name, {"metadata": {"annotations": dict(wanted)}}, _request_timeout=5)
    return "written"


class NodeAnnotator:
    """Patches the node's annotations at start, after every inventory change, and whenever a
    check every `resync_s` finds them missing or different (the node registered again, or
    someone removed or overwrote them)."""

    def __init__(
        self,
        api_client: Any,
        node_name: str,
        inventory: LiveInventory,
        budget_mib: int,
        resync_s: float = RESYNC_S,
    ):
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
        self.republisher = Republisher(
            "node-annotator", self._publish, outage, 0.2, resync_s=resync_s
        )
        inventory.subscribe(lambda _inventory: self.republisher.poke())

    def start(self) -> None:
        """Publish now and keep publishing on changes."""
        self.republisher.start()

    def stop(self) -> None:
        """Stop publishing."""
        self.republisher.stop()

    def _publish(self) -> None:
        _, inventory = self.inventory.snapshot()
        wanted = node_annotations(inventory, self.budget_mib)
        done = annotate_once(self._core, self.node_name, wanted)
        level = logging.DEBUG if done == "unchanged" else logging.INFO
        log.log(level, "annotations of node %s %s", self.node_name, done)

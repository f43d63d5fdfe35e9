"""The node annotations the extender reads: GPU inventory and host DRAM budget, kept current."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from baton.contract.annotations import AnnotationError, decode_budget, decode_gpus
from baton.contract.annotations import node_annotations as annotations_of_node
from baton.contract.kube import Outage, api_error_reason
from baton.contract.meminfo import mem_total_kib
from baton.contract.names import ANNOTATION_GPUS, ANNOTATION_HOST_MEMORY_BUDGET
from baton.contract.reflector import KubeSource, Reflector, WatchEvent
from nodegpu.inventory import Inventory
from nodegpu.republish import Republisher
from nodegpu.state import LiveInventory

log = logging.getLogger(__name__)
DEFAULT_HOST_MEMORY_BUDGET = "50%"
POLL_S = 10.0
"""Seconds between checks that the node still carries the annotations where its role refuses
the watch of it: a node deleted and registered again under its name has none, and someone else
may remove or overwrite them."""
WATCH_RETRY_S = 120.0
"""Seconds between tries of the refused watch while polling: a binding that grants it may land
after the daemon starts (a GitOps sync), and then the watch takes over again."""


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


class _NodeSeen:
    """The store of the node's own watch: hands `seen` each version of the node it shows."""

    def __init__(self, seen: Callable[[dict[str, Any]], None]) -> None:
        self._seen = seen

    def replace(self, objects: list[dict[str, Any]], resource_version: str) -> None:
        for node in objects:
            self._seen(node)

    def apply(self, event: WatchEvent) -> None:
        if event.type != "DELETED":  # registered again, it is ADDED
            self._seen(event.object)


class NodeAnnotator:
    """Patches the node's annotations at start, after every inventory change, and whenever the
    watch of the node shows them missing or different or the node replaced (registered again,
    or someone removed or overwrote them). Under a role without `list`/`watch` on nodes it
    checks them every `poll_s` instead, and tries the watch again every `watch_retry_s` (said
    once, and again only when the refusal changes or the watch is answered).

    No periodic check runs beside the watch: it resumes from the last version seen, and a relist
    (history gone) shows the node as it is, so no change to it goes unseen."""

    def __init__(
        self,
        api_client: Any,
        node_name: str,
        inventory: LiveInventory,
        budget_mib: int,
        poll_s: float = POLL_S,
        watch_retry_s: float = WATCH_RETRY_S,
    ):
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)
        self.node_name = node_name
        self.inventory = inventory
        self.budget_mib = budget_mib
        self.poll_s = poll_s
        self.watch_retry_s = watch_retry_s
        self.polling = threading.Event()
        """Set while the watch is refused (403): the annotations are polled instead."""
        self.watching = threading.Event()
        """Set once a watch of the node is answered (the role allows it), cleared when the list
        or the watch is refused."""
        self._refusal = ""
        """The refusal said last while polling: a different one is said again."""
        self._uid: str | None = None
        outage = Outage(
            log,
            f"annotating node {node_name}",
            "the extender does not see this node's GPUs and host budget, or sees old ones",
        )
        self.republisher = Republisher("node-annotator", self._publish, outage, 0.2)
        watch_outage = Outage(
            log,
            f"watch of node {node_name}",
            "annotations removed from it come back only after a GPU health change",
        )
        source = KubeSource(api_client, "nodes", field_selector=f"metadata.name={node_name}")
        self.watch = Reflector(
            source,
            _NodeSeen(self._seen),
            watch_outage,
            name="node-annotation-watch",
            refused=self._forbidden,
            watching=self._watch_answered,
        )
        inventory.subscribe(lambda _inventory: self.republisher.poke())

    def start(self) -> None:
        """Publish now and keep publishing on changes."""
        self.republisher.start()
        self.watch.start()

    def stop(self) -> None:
        """Stop publishing."""
        self.watch.stop()
        self.republisher.stop()

    def _wanted(self) -> dict[str, str]:
        return node_annotations(self.inventory.snapshot()[1], self.budget_mib)

    def _publish(self) -> None:
        done = annotate_once(self._core, self.node_name, self._wanted())
        level = logging.DEBUG if done == "unchanged" else logging.INFO
        log.log(level, "annotations of node %s %s", self.node_name, done)

    def _seen(self, node: dict[str, Any]) -> None:
        """A version of the node from the watch: publish when it lacks what is wanted."""
        meta = node.get("metadata") or {}
        uid = meta.get("uid")
        replaced = self._uid is not None and uid != self._uid
        self._uid = uid
        if replaced or not same_annotations(meta.get("annotations") or {}, self._wanted()):
            self.republisher.poke()

    def _watch_answered(self) -> None:
        """A watch of the node was answered: the role allows it, so the watch replaces the poll
        (not at a list alone: a role with `list` but not `watch` would switch back and forth)."""
        if self.polling.is_set():
            log.info("watching node %s again: its annotations are no longer polled", self.node_name)
            self.polling.clear()
            self.republisher.resync_every(None)
        self.watching.set()  # last: who waits for it finds the poll off

    def _forbidden(self, err: Exception) -> float | None:
        """A role without list/watch on nodes (an older ClusterRole, or a binding not there
        yet): poll instead, said once, and try the watch again after `watch_retry_s`."""
        if getattr(err, "status", None) != 403:
            return None
        self.watching.clear()
        refusal = api_error_reason(err)
        if not self.polling.is_set() or refusal != self._refusal:
            listed = bool(self.watch.resource_version)  # the list was answered, the watch not
            log.warning(
                "watching node %s is forbidden (%s): its role lacks %s on nodes; "
                "checking its annotations every %g s instead, and the watch again every %g s",
                self.node_name,
                refusal,
                "watch" if listed else "list and watch",
                self.poll_s,
                self.watch_retry_s,
            )
            self._refusal = refusal
        if not self.polling.is_set():
            self.polling.set()
            self.republisher.resync_every(self.poll_s)
        return self.watch_retry_s

"""Keeps this node's ResourceSlice current: after every kubelet registration (the kubelet
deletes its node's slices when it starts) and every health change.

Only this driver's slices on this node are touched: one is created or replaced, any other of
ours there (an older name) is deleted; other drivers' slices are never listed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from baton.contract.kube import Outage
from dra.slices import keep_taint_times, owned_by, resource_slice, same_devices, slice_name
from nodegpu.republish import Republisher
from nodegpu.state import LiveInventory

log = logging.getLogger(__name__)


class SliceApi(Protocol):
    """The slice calls the publisher needs (`baton.contract.draapi.DraApi`, or a test's store)."""

    def list_slices(self) -> list[dict[str, Any]]: ...
    def create_slice(self, body: dict[str, Any]) -> None: ...
    def replace_slice(self, name: str, body: dict[str, Any]) -> None: ...
    def delete_slice(self, name: str) -> None: ...


def publish_once(
    api: SliceApi, node_name: str, inventory: LiveInventory, node_uid: Callable[[], str]
) -> str:
    """Make the node's slice match the inventory; what was done, in words.

    `node_uid()` is asked before each write, so the slice is owned by the node as it is then:
    a node deleted and registered again under its name has a new UID, and the garbage
    collector deletes a slice owned by the old one (the next publication creates it again).
    """
    ours = slice_name(node_name)
    current = {s["metadata"]["name"]: s for s in api.list_slices()}
    for name in current:
        if name != ours:
            api.delete_slice(name)
    existing = current.get(ours)
    _, snapshot = inventory.snapshot()
    generation = ((existing or {}).get("spec") or {}).get("pool", {}).get("generation", 0)
    wanted = resource_slice(node_name, snapshot, int(generation) + 1)
    if existing is not None:
        keep_taint_times(existing, wanted)
        if same_devices(existing, wanted):
            return "unchanged"
    owned_by(wanted, node_uid())
    if existing is None:
        api.create_slice(wanted)
        return "created"
    wanted["metadata"]["resourceVersion"] = existing["metadata"].get("resourceVersion", "")
    api.replace_slice(ours, wanted)
    return "replaced"


RESYNC_S = 10.0
"""Seconds between checks that the slice is still there: the kubelet deletes a driver's slices
when it loses the driver's registration (it restarts), possibly after the driver registered
again and found its slice in place."""


class SlicePublisher:
    """Publishes the node's slice at start, whenever poked, after every inventory change and
    every `RESYNC_S` (a slice deleted by someone else comes back), retrying with backoff until
    it succeeds (`nodegpu.republish`)."""

    def __init__(
        self,
        api: SliceApi,
        node_name: str,
        inventory: LiveInventory,
        node_uid: Callable[[], str] = lambda: "",
    ) -> None:
        """`node_uid()` is the node's UID as the API has it now (the slice's owner)."""
        self.api = api
        self.node_name = node_name
        self.inventory = inventory
        self.node_uid = node_uid
        self.publications = 0
        outage = Outage(
            log,
            f"publishing node {node_name}'s ResourceSlice",
            "the scheduler allocates from the old slice, or none",
        )
        self.republisher = Republisher(
            "slice-publisher", self._publish, outage, 0.5, resync_s=RESYNC_S
        )
        self.published = self.republisher.published
        """Set once the latest inventory and registration are published."""
        inventory.subscribe(lambda _inventory: self.poke())

    def poke(self) -> None:
        """Publish again soon (a registration or a health change)."""
        self.republisher.poke()

    def start(self) -> None:
        self.republisher.start()

    def stop(self) -> None:
        self.republisher.stop()

    def _publish(self) -> None:
        done = publish_once(self.api, self.node_name, self.inventory, self.node_uid)
        self.publications += 1
        level = logging.DEBUG if done == "unchanged" else logging.INFO
        log.log(level, "ResourceSlice of node %s %s", self.node_name, done)

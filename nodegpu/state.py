"""The live inventory shared by ListAndWatch streams, health checks and the node annotator."""

from __future__ import annotations

import threading
from collections.abc import Callable

from nodegpu.inventory import Inventory

Listener = Callable[[Inventory], None]


class LiveInventory:
    """The current Inventory with a version that increases on every change."""

    def __init__(self, inventory: Inventory) -> None:
        self._inventory = inventory
        self._version = 0
        self._changed = threading.Condition()
        self._listeners: list[Listener] = []
        self._told = 0
        self._telling = False

    def snapshot(self) -> tuple[int, Inventory]:
        """The current version and inventory."""
        with self._changed:
            return self._version, self._inventory

    def set_health(self, uuid: str, healthy: bool, reason: str = "") -> bool:
        """Change one GPU's health; True (and listeners told) when anything changed.

        While another thread is telling the listeners, that thread tells them this change too.
        """
        with self._changed:
            was_healthy = uuid not in self._inventory.unhealthy
            updated = self._inventory.with_health(uuid, healthy, reason)
            if was_healthy == healthy:
                return False
            self._inventory = updated
            self._version += 1
            self._changed.notify_all()
            if self._telling:
                return True
            self._telling = True
        self._tell()
        return True

    def _tell(self) -> None:
        """Tell the listeners the newest inventory until they have heard the newest version,
        so they hear changes in version order and the newest last."""
        try:
            while True:
                with self._changed:
                    if self._told == self._version:
                        self._telling = False
                        return
                    self._told, inventory = self._version, self._inventory
                    listeners = list(self._listeners)
                for listener in listeners:
                    listener(inventory)
        except BaseException:
            with self._changed:
                self._telling = False
            raise

    def subscribe(self, listener: Listener) -> None:
        """Call `listener` with the new inventory after every change."""
        with self._changed:
            self._listeners.append(listener)

    def wake(self) -> None:
        """Wake every waiter so it re-checks its stop condition."""
        with self._changed:
            self._changed.notify_all()

    def wait_newer(
        self, version: int, done: Callable[[], bool], timeout: float
    ) -> tuple[int, Inventory] | None:
        """Block until the version passes `version` (returns it) or `done()` (returns None).

        `timeout` bounds each wait; a caller loops while it wants to keep watching.
        """
        with self._changed:
            self._changed.wait_for(lambda: self._version != version or done(), timeout)
            if done() or self._version == version:
                return None
            return self._version, self._inventory

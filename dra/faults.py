"""Fake faults of the driver itself (with `--fake-gpus` only), for tests of what a cut leaves.

`POST /fake/hold-prepare` on the metrics port arms `PrepareHold`: the next prepare stops after
writing its claim's CDI spec and before recording it, which is where a driver killed in the
middle of a prepare leaves things. The test then kills the driver; the hold never lets that
prepare finish, also when the driver is stopped gracefully.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from dra.prepare import PrepareError

log = logging.getLogger(__name__)
HOLD_S = 300.0
"""How long a held prepare waits for the driver to be killed before it gives up (and fails)."""


class PrepareHold:
    """Holds the next prepare between its spec and its record, once armed."""

    def __init__(self, hold_s: float = HOLD_S) -> None:
        self.hold_s = hold_s
        self._armed = threading.Event()
        self._stopping = threading.Event()
        self.holding = threading.Event()
        """Set once a prepare is held."""

    def arm(self, body: dict[str, Any]) -> dict[str, Any]:
        """The POST handler: hold the next prepare."""
        self._armed.set()
        return {"armed": True}

    def stop(self) -> None:
        """The driver is stopping: a held prepare fails without recording its claim."""
        self._stopping.set()

    def __call__(self, uid: str) -> None:
        """Called by the preparer after the spec is written, before the record."""
        if not self._armed.is_set():
            return
        self._armed.clear()
        self.holding.set()
        log.warning(
            "holding the prepare of claim %s after writing its CDI spec, before recording it "
            "(fake fault): kill the driver now (the hold gives up after %.0f s)",
            uid,
            self.hold_s,
        )
        self._stopping.wait(self.hold_s)
        raise PrepareError(f"the prepare of claim {uid} was held (fake fault) and not finished")

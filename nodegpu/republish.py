"""Keeping one API object in step with the node: publish at start and again after every change,
a failure retried with backoff until a publication succeeds.

The node annotator (`annotate.py`) and the DRA driver's ResourceSlice publisher each run one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from baton.contract.kube import Outage

MAX_BACKOFF_S = 10.0


class Republisher:
    """A thread that calls `publish` once started and again whenever poked."""

    def __init__(
        self,
        name: str,
        publish: Callable[[], None],
        outage: Outage,
        first_backoff_s: float,
        resync_s: float | None = None,
    ) -> None:
        """`outage` says when publishing starts and stops failing; `first_backoff_s` is the
        wait after a first failure, doubled after each next one up to `MAX_BACKOFF_S`;
        `resync_s`, if given, publishes again after that long without a change (for an object
        someone else may delete: `publish` must then find it as it is)."""
        self._resync_s = resync_s
        self.publish = publish
        self.published = threading.Event()
        """Set once the latest change is published; cleared by a poke."""
        self._outage = outage
        self._first_backoff_s = first_backoff_s
        self._pending = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def poke(self) -> None:
        """Publish again soon (something the object shows changed)."""
        self.published.clear()
        self._pending.set()

    def resync_every(self, resync_s: float | None) -> None:
        """From now on publish again after `resync_s` without a change too, or (None) only on
        changes (and once soon either way)."""
        self._resync_s = resync_s
        self.poke()

    def start(self) -> None:
        """Publish now and keep publishing on changes."""
        self._pending.set()
        self._thread.start()

    def stop(self) -> None:
        """Stop publishing (a wait between retries ends at once); also one never started."""
        self._stop.set()
        self._pending.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=MAX_BACKOFF_S + 5)

    def _run(self) -> None:
        backoff = self._first_backoff_s
        while True:
            self._pending.wait(self._resync_s)
            if self._stop.is_set():
                return
            self._pending.clear()
            try:
                self.publish()
            except Exception as err:  # any API failure: retry, the object must get there
                self._outage.failed(err, backoff)
                self._pending.set()
                self._stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            self._outage.answered()
            backoff = self._first_backoff_s
            if not self._pending.is_set():
                self.published.set()

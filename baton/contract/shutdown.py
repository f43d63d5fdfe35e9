"""How the daemons learn they should stop: SIGTERM (Kubernetes) or SIGINT (a terminal)."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
DEFAULT_GRACE_S = 5.0
"""Seconds in-flight requests get to finish once a daemon is told to stop."""


def signal_name(sig: int) -> str:
    """`SIGTERM` for 15, and so on."""
    return signal.Signals(sig).name


def on_stop_signal_async(loop: asyncio.AbstractEventLoop, stop: Callable[[str], None]) -> None:
    """Call `stop(signal name)` on the loop when a stop signal arrives."""
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop, sig.name)


def run_until(start: Callable[[], None], stop: Callable[[], None], until: threading.Event) -> None:
    """A threaded daemon's life: `start()`, block until `until` is set, `stop()`; a start that
    fails part-way stops what it started before the error goes on."""
    try:
        start()
    except BaseException:
        stop()
        raise
    try:
        until.wait()
    finally:
        stop()


class StopSignal:
    """A stop signal caught from the main thread; `wait` blocks until one arrives."""

    def __init__(self) -> None:
        self.received: str | None = None
        self._event = threading.Event()

    def install(self) -> StopSignal:
        """Catch the stop signals (call from the main thread)."""
        for sig in STOP_SIGNALS:
            signal.signal(sig, self.handle)
        return self

    def handle(self, sig: int, _frame: FrameType | None = None) -> None:
        """Record the signal and wake whoever waits."""
        self.received = self.received or signal_name(sig)
        self._event.set()

    @property
    def event(self) -> threading.Event:
        """Set once a stop signal arrived."""
        return self._event

"""How the daemons learn they should stop: SIGTERM (Kubernetes) or SIGINT (a terminal)."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
DEFAULT_GRACE_S = 5.0
"""Seconds in-flight requests get to finish once a daemon is told to stop."""
SLOW_STOP_S = 1.0
"""A part that takes longer than this to stop is named in the log (where a slow exit went)."""
SIGNAL_CHECK_S = 0.5
"""How often a threaded daemon's main thread wakes to run a stop signal's handler that another
thread took (`run_until`)."""

log = logging.getLogger(__name__)


def signal_name(sig: int) -> str:
    """`SIGTERM` for 15, and so on."""
    return signal.Signals(sig).name


def on_stop_signal_async(loop: asyncio.AbstractEventLoop, stop: Callable[[str], None]) -> None:
    """Call `stop(signal name)` on the loop when a stop signal arrives."""
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop, sig.name)


def run_until(start: Callable[[], None], stop: Callable[[], None], until: threading.Event) -> None:
    """A threaded daemon's life: `start()`, block until `until` is set, `stop()`; a start that
    fails part-way stops what it started before the error goes on.

    The kernel hands a stop signal to any of the process's threads, and Python runs its handler
    on the main thread only when that thread next runs: a wait with no timeout would never
    return. So the wait wakes every `SIGNAL_CHECK_S`."""
    try:
        start()
    except BaseException:
        stop()
        raise
    try:
        while not until.wait(SIGNAL_CHECK_S):
            pass
    finally:
        stop()


def stop_parts(
    what: str, parts: Sequence[tuple[str, Callable[[], object]]], slow_s: float = SLOW_STOP_S
) -> None:
    """Stop `parts` (name, stop) in order, each even when one before it failed. A part that
    failed (with its traceback) or took longer than `slow_s` is logged by name; each part's
    start is a debug line, so an exit stuck in one shows where with `--log-level debug`."""
    for name, stop in parts:
        log.debug("%s: stopping %s", what, name)
        began = time.monotonic()
        try:
            stop()
        except Exception as err:  # the rest must still stop; the error is said, not raised
            log.error("%s: stopping %s failed: %s", what, name, err, exc_info=err)
        took = time.monotonic() - began
        if took > slow_s:
            log.warning("%s: stopping %s took %.1f s", what, name, took)


class StopSignal:
    """A stop signal caught from the main thread; `wait` blocks until one arrives."""

    def __init__(self) -> None:
        self.received: str | None = None
        self._event = threading.Event()
        self._also: list[threading.Event] = []

    def install(self) -> StopSignal:
        """Catch the stop signals (call from the main thread)."""
        for sig in STOP_SIGNALS:
            signal.signal(sig, self.handle)
        return self

    @contextmanager
    def caught(self) -> Iterator[StopSignal]:
        """Note the stop signals for the block (a start then stops in order once it can), then
        give back the handlers found. A second one during the block goes to the handlers found
        (by default: the process ends, or KeyboardInterrupt), so a start that hangs can still be
        interrupted."""
        found = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

        def give_back() -> None:
            for sig, handler in found.items():  # (None: a handler not set from Python)
                signal.signal(sig, signal.SIG_DFL if handler is None else handler)

        def handle(sig: int, frame: FrameType | None) -> None:
            if self.received is None:
                self.handle(sig, frame)
                return
            give_back()  # a second: the start hangs, or its caller insists
            signal.raise_signal(sig)

        for sig in STOP_SIGNALS:
            signal.signal(sig, handle)
        try:
            yield self
        finally:
            give_back()

    def handle(self, sig: int, _frame: FrameType | None = None) -> None:
        """Record the signal and wake whoever waits."""
        self.received = self.received or signal_name(sig)
        self._event.set()
        for event in self._also:
            event.set()

    def also_wake(self, event: threading.Event) -> None:
        """Set `event` too when a stop signal arrives (at once if one has): for a wait on
        something else that a stop must cut short."""
        self._also.append(event)
        if self._event.is_set():
            event.set()

    @property
    def event(self) -> threading.Event:
        """Set once a stop signal arrived."""
        return self._event

"""A Ctrl-C held back while a few steps that must not be cut in two run.

Python raises `KeyboardInterrupt` between any two bytecodes of the main thread. Where that would
leave memory half-moved with no record of it (device storages freed and the park not yet
recorded), `deferred_interrupt` keeps a SIGINT that arrives meanwhile and raises it once the
steps are done. A caller that records what a callback did (the client, of the parks it ran)
runs the callback under `held_until_recorded`: once a `deferred_interrupt` inside it began, the
SIGINT waits for that block's end instead, so a park past its point of no return is recorded
by the caller too. Only the main thread can be interrupted so, and only there is the handler
swapped; elsewhere both do nothing.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

Caught = list[tuple[int, FrameType | None]]


class _Hold:
    """A `held_until_recorded` block, and the deferral a `deferred_interrupt` in it began."""

    def __init__(self) -> None:
        self.previous: Callable[..., Any] | int | None = None
        self.caught: Caught = []


_holds: list[_Hold] = []
"""The `held_until_recorded` blocks the main thread is in, innermost last."""


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[None]:
    """Run the block whole: a SIGINT during it is raised (as the handler it replaced would)
    as the block ends, or as the `held_until_recorded` block around it ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    hold = _holds[-1] if _holds else None
    if hold is not None and hold.previous is not None:  # deferring already, to the hold's end
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is None:  # a handler not set from Python: it cannot be put back
        yield
        return
    caught: Caught = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append((signum, frame)))
    if hold is not None:  # the hold puts the handler back and raises, as it ends
        hold.previous, hold.caught = previous, caught
        yield
        return
    try:
        yield
    finally:
        _put_back(previous, caught)


@contextlib.contextmanager
def held_until_recorded() -> Iterator[None]:
    """Around a callback and the caller's record of what it did: a SIGINT that a
    `deferred_interrupt` inside the callback held back is raised as this block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    hold = _Hold()
    _holds.append(hold)
    try:
        yield
    finally:
        _holds.remove(hold)
        if hold.previous is not None:
            _put_back(hold.previous, hold.caught)


def _put_back(previous: Callable[..., Any] | int, caught: Caught) -> None:
    """Give SIGINT its handler back and raise what was caught meanwhile as it would have."""
    signal.signal(signal.SIGINT, previous)
    if caught:
        if callable(previous):
            previous(*caught[0])
        elif previous == signal.SIG_DFL:
            signal.raise_signal(signal.SIGINT)

"""A Ctrl-C held back while a few steps that must not be cut in two run.

Python raises `KeyboardInterrupt` between any two bytecodes of the main thread. Where that would
leave memory half-moved with no record of it (device storages freed and the park not yet
recorded), `deferred_interrupt` keeps a SIGINT that arrives meanwhile and raises it once the
steps are done. Only the main thread can be interrupted so, and only there is the handler
swapped; elsewhere it does nothing.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[None]:
    """Run the block whole: a SIGINT during it is raised (as the handler it replaced would)
    as the block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is None:  # a handler not set from Python: it cannot be put back
        yield
        return
    caught: list[tuple[int, FrameType | None]] = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append((signum, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            if callable(previous):
                previous(*caught[0])
            elif previous == signal.SIG_DFL:
                signal.raise_signal(signal.SIGINT)

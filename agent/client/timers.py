"""The clients' timers: a kept turn given back to the agent when nobody takes it, renewals.

A yield that keeps the lease (`KeepTurn`, `agent.client.session_core`) sends nothing; if the
caller does not ask again within the window, the lease must still go back to the agent, or the
GPU would stand idle for a tenant that went away. In the blocking client one thread per client
waits for that deadline (`Keeper`); it starts with the first kept yield, so a client that never
keeps a turn has none. The asyncio client sets a timer on its loop (`LoopTimer`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable


class Keeper:
    """Runs `give_back` once `deadline()` (None: nothing kept) has passed."""

    def __init__(
        self,
        deadline: Callable[[], float | None],
        give_back: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._deadline = deadline
        self._give_back = give_back
        self._clock = clock
        self._wake = threading.Condition()
        self._poked = False
        self._closed = False
        self._thread: threading.Thread | None = None

    def poke(self) -> None:
        """A turn was kept: look at the deadline again."""
        with self._wake:
            if self._closed:
                return
            self._poked = True
            self._wake.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="baton-keeper", daemon=True)
                self._thread.start()

    @property
    def started(self) -> bool:
        """Whether its thread was started (by a first `poke`)."""
        return self._thread is not None

    def close(self) -> None:
        """Stop the thread (what is kept goes with the session)."""
        with self._wake:
            self._closed = True
            self._wake.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            deadline = self._deadline()
            with self._wake:
                if not self._poked and not self._closed:
                    wait = None if deadline is None else deadline - self._clock()
                    if wait is None or wait > 0:
                        self._wake.wait(wait)
                self._poked = False
                if self._closed:
                    return
            self._give_back()  # a no-op unless a kept lease is due


class LoopTimer:
    """The asyncio client's timers (the renewal, the kept turn's deadline): `fire` runs on the
    event loop once the time last `set` (by `clock`) has come."""

    def __init__(self, fire: Callable[[], None], clock: Callable[[], float]) -> None:
        self._fire = fire
        self._clock = clock
        self._handle: asyncio.TimerHandle | None = None

    def set(self, at: float | None) -> None:
        """Fire at `at` instead (None: not at all)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if at is not None:
            delay = max(0.0, at - self._clock())
            self._handle = asyncio.get_running_loop().call_later(delay, self._run)

    def _run(self) -> None:
        self._handle = None
        self._fire()

"""Runs the agent's park/restore callbacks for the blocking client, fenced by `close()`.

The reader thread runs each callback as it reads it, in order (the agent asks one tenant for
one move at a time, and the reader has nothing else to do meanwhile that cannot wait: turns are
taken and given back on the call link). No hand-off to another thread sits in a handover.
Closing fences the runner: callbacks asked for after that are answered with an error without
running, and the one in flight is waited for (bounded), so a process never leaves in the middle
of moving its memory. A client the program never closed is closed at interpreter exit the same
way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import NamedTuple

from agent.client.types import Callback, run_callback_blocking
from baton._pb import agent_pb2 as pb

log = logging.getLogger("baton.client")

CLOSE_WAIT_S = 60.0
"""How long closing waits for a park or restore in flight (the agent's own callback timeout)."""
TIMINGS_KEPT = 4096
"""Callbacks whose timings are kept (the latest)."""


class CallbackTiming(NamedTuple):
    """When one callback's message was read, ran, and was answered (wall-clock seconds)."""

    action: str
    received: float
    started: float
    finished: float
    answered: float
    moved: int


class CallbackRunner:
    """Runs callbacks on the thread that reads them and answers each; `close()` fences."""

    def __init__(
        self, callbacks: Mapping[str, Callback], answer: Callable[[pb.CallbackResult], None]
    ) -> None:
        self._callbacks = callbacks
        self._answer = answer
        self._running: pb.Callback | None = None
        self._runner: threading.Thread | None = None
        self._fenced = False
        self._cond = threading.Condition()
        self.timings: deque[CallbackTiming] = deque(maxlen=TIMINGS_KEPT)

    def run(self, request: pb.Callback, received: float | None = None) -> None:
        """Run `request` and answer it; refused at once once the runner is fenced."""
        received = time.time() if received is None else received
        with self._cond:
            fenced = self._fenced
            if not fenced:
                self._running, self._runner = request, threading.current_thread()
        if fenced:
            self._refuse(request)
            return
        try:
            started = time.time()
            result = run_callback_blocking(self._callbacks.get(request.action), request)
            finished = time.time()
            self._answer(result)
            timing = CallbackTiming(
                request.action, received, started, finished, time.time(), int(result.bytes)
            )
            self.timings.append(timing)
        finally:
            with self._cond:
                self._running = None
                self._cond.notify_all()

    def close(self, timeout: float = CLOSE_WAIT_S) -> bool:
        """Fence, and wait up to `timeout` for the callback in flight.

        True once none runs; False (and an error logged) if one is still running.
        """
        with self._cond:
            self._fenced = True
            if self._running is None or self._runner is threading.current_thread():
                return True  # none runs, or closed from inside one: it ends when this returns
            ended = self._cond.wait_for(lambda: self._running is None, timeout)
            running = self._running
        if not ended and running is not None:
            log.error(
                "on_%s(%s) still runs %.3g s after this Baton client began closing; closing "
                "anyway (is the framework's offload stuck?), and the process may exit under it",
                running.action, running.gpu, timeout,
            )  # fmt: skip
        return ended

    def _refuse(self, request: pb.Callback) -> None:
        error = f"the tenant is closing its Baton client: on_{request.action} not run"
        self._answer(pb.CallbackResult(call_id=request.call_id, error=error))

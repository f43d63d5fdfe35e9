"""Runs the agent's park/restore callbacks for the blocking client: in order, on one thread.

The reader thread hands each callback over and goes back to the socket. Closing fences the
worker: callbacks asked for after that are answered with an error without running, and the
one in flight is waited for (bounded), so a process never leaves in the middle of moving its
memory. A client the program never closed is closed at interpreter exit the same way.
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


class CallbackWorker:
    """One thread that runs callbacks in the order they came and answers each."""

    def __init__(
        self,
        callbacks: Mapping[str, Callback],
        answer: Callable[[pb.CallbackResult], None],
        name: str = "baton-callbacks",
    ) -> None:
        self._callbacks = callbacks
        self._answer = answer
        self._name = name
        self._queue: deque[tuple[pb.Callback, float]] = deque()
        self._running: pb.Callback | None = None
        self._fenced = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self.timings: deque[CallbackTiming] = deque(maxlen=TIMINGS_KEPT)

    def submit(self, request: pb.Callback, received: float | None = None) -> None:
        """Run `request` after those before it; refused at once once the worker is fenced."""
        received = time.time() if received is None else received
        with self._cond:
            if not self._fenced:
                self._queue.append((request, received))
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._serve, name=self._name, daemon=True
                    )
                    self._thread.start()
                self._cond.notify_all()
                return
        self._refuse(request)

    @property
    def busy(self) -> bool:
        """True while a callback runs or waits to."""
        with self._cond:
            return self._running is not None or bool(self._queue)

    def close(self, timeout: float = CLOSE_WAIT_S) -> bool:
        """Fence: refuse what has not started, wait up to `timeout` for the callback in flight.

        True once none runs; False (and an error logged) if one is still running.
        """
        with self._cond:
            self._fenced = True
            waiting = [request for request, _ in self._queue]
            self._queue.clear()
            self._cond.notify_all()
            if self._thread is threading.current_thread():
                ended = True  # closed from inside a callback: it ends when this returns
            else:
                ended = self._cond.wait_for(lambda: self._running is None, timeout)
            running = self._running
        for request in waiting:
            self._refuse(request)
        if not ended and running is not None:
            log.error(
                "on_%s(%s) still runs %.3g s after this Baton client began closing; closing "
                "anyway (is the framework's offload stuck?), and the process may exit under it",
                running.action, running.gpu, timeout,
            )  # fmt: skip
        return ended

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._fenced:
                    self._cond.wait()
                if not self._queue:
                    return
                request, received = self._queue.popleft()
                self._running = request
            try:
                self._run(request, received)
            finally:
                with self._cond:
                    self._running = None
                    self._cond.notify_all()

    def _run(self, request: pb.Callback, received: float) -> None:
        started = time.time()
        result = run_callback_blocking(self._callbacks.get(request.action), request)
        finished = time.time()
        self._answer(result)
        timing = CallbackTiming(
            request.action, received, started, finished, time.time(), int(result.bytes)
        )
        self.timings.append(timing)

    def _refuse(self, request: pb.Callback) -> None:
        error = f"the tenant is closing its Baton client: on_{request.action} not run"
        self._answer(pb.CallbackResult(call_id=request.call_id, error=error))

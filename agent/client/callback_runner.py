"""Runs the agent's park/restore callbacks for the blocking client, fenced by `close()`.

The reader thread runs each callback as it reads it, in order (the agent asks one tenant for
one move at a time, and the reader has nothing else to do meanwhile that cannot wait: turns are
taken and given back on the call link); a restore left to a grant runs on the thread that
asked for the turn. One callback runs at a time. No hand-off to another thread sits in a
handover.

Closing fences the runner: callbacks asked for after that are answered with an error without
running, and the one in flight is waited for (bounded), so a process never leaves in the middle
of moving its memory. A client the program never closed is closed at interpreter exit the same
way.

The runner keeps what this process parked (`agent.client.parked`): a client that restores with
its grant restores it on the thread that asked for the turn (`restore_parked`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from agent.client.errors import BatonError
from agent.client.interrupts import held_until_recorded
from agent.client.parked import Parked, restores_itself
from agent.client.types import Callback, run_callback_blocking
from baton._pb import agent_pb2 as pb

log = logging.getLogger("baton.client")

CLOSE_WAIT_S = 60.0
"""How long closing waits for a park or restore in flight."""
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
        self._moving = threading.Lock()
        """One callback at a time, whichever thread runs it (the reader, or a caller's)."""
        self.parked = Parked()
        self.timings: deque[CallbackTiming] = deque(maxlen=TIMINGS_KEPT)

    @property
    def restores(self) -> bool:
        """Whether this client parks and restores itself (it has both callbacks)."""
        return restores_itself(self._callbacks)

    def run(self, request: pb.Callback, received: float | None = None) -> None:
        """Run `request` and answer it; refused at once once the runner is fenced."""
        received = time.time() if received is None else received
        timing = self._run(request, received, self._answer)
        if timing is None:
            self._refuse(request)
        else:
            self.timings.append(timing)

    def restore_parked(self) -> None:
        """Restore every GPU this process parked, here and now (a grant that left the restore
        to it arrived); `BatonError` naming the GPU if a restore fails or the client closes."""
        errors: list[str] = []
        for gpu in self.parked.gpus():
            request = pb.Callback(action="restore", gpu=gpu)
            timing = self._run(request, None, lambda result: errors.append(result.error))
            if timing is None:
                raise BatonError(f"this Baton client is closing: on_restore({gpu}) not run")
            if errors[-1]:
                raise BatonError(f"on_restore({gpu}) failed: {errors[-1]}")
            self.timings.append(timing)

    def park_for_yield(self, gpus: Sequence[str]) -> dict[str, int]:
        """Park `gpus` here and now, as the turn ends (the agent said the tenant due next needs
        the room); GPU → bytes moved, for the parks that ran. One that fails is left to the
        agent (it parks by callback, as it would have)."""
        parked: dict[str, int] = {}
        for gpu in gpus:
            results: list[pb.CallbackResult] = []
            timing = self._run(pb.Callback(action="park", gpu=gpu), None, results.append)
            if timing is None:  # closing
                break
            if results[-1].error:
                log.warning("on_park(%s) as the turn ended failed: %s", gpu, results[-1].error)
                continue
            self.timings.append(timing)
            parked[gpu] = int(results[-1].bytes)
        return parked

    def _run(
        self,
        request: pb.Callback,
        received: float | None,
        answer: Callable[[pb.CallbackResult], None],
    ) -> CallbackTiming | None:
        """Run one callback and `answer` it before a close may end the session; None if fenced.
        Keeps `parked` up to date. `received` None: no message asked for it (a grant did)."""
        with self._moving:
            with self._cond:
                if self._fenced:
                    return None
                self._running, self._runner = request, threading.current_thread()
            try:
                started = time.time()
                # A Ctrl-C once the park cannot be undone (TorchParker frees the storages) is
                # raised once it is recorded here: else a park asked again is refused.
                with held_until_recorded():
                    result = self.parked.instead(request)
                    if result is None:
                        result = self._call(request)
                    result.call_id = request.call_id
                    finished = time.time()
                    self.parked.ran(request, result)
                answer(result)
                answered = time.time() if received is not None else finished
            finally:
                with self._cond:
                    self._running = None
                    self._cond.notify_all()
        read = started if received is None else received
        return CallbackTiming(request.action, read, started, finished, answered, result.bytes)

    def _call(self, request: pb.Callback) -> pb.CallbackResult:
        return run_callback_blocking(self._callbacks.get(request.action), request)

    def running_here(self) -> bool:
        """Whether the current thread runs the callback in flight (its callback closes the
        client): one the reader read meanwhile waits for it to end."""
        with self._cond:
            return self._running is not None and self._runner is threading.current_thread()

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

    def fence_unless(self, keep: Callable[[], bool], timeout: float = CLOSE_WAIT_S) -> bool:
        """Fence as `close` does unless `keep()`, asked once no callback runs (the one in
        flight, waited for up to `timeout`, ends first), so nothing moves between its answer
        and the fence; returns that answer (False, fenced, if the one in flight runs on)."""
        with self._cond:
            inside = self._running is not None and self._runner is threading.current_thread()
        quiet = not inside and self._moving.acquire(timeout=timeout)
        try:
            if (quiet or inside) and keep():
                return True
            with self._cond:
                self._fenced = True
            return False
        finally:
            if quiet:
                self._moving.release()

    def _refuse(self, request: pb.Callback) -> None:
        error = f"the tenant is closing its Baton client: on_{request.action} not run"
        self._answer(pb.CallbackResult(call_id=request.call_id, error=error))

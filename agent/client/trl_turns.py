"""The turns a `BatonCallback` holds (`agent.client.trl`): begun and ended as the trainer's events
say (`agent.client.trl_events`), held for a `turn()` block, handed back for an off-turn call, and
given back for good by `close()`."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from agent.client.errors import AgentUnavailable, BatonError
from agent.client.off_turn import OffTurn
from agent.client.restarts import across_agent_restarts
from agent.client.sync import Baton
from agent.client.torch import TorchParker

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


class TurnHolder:
    """A training process's Baton turn, one at a time; parks through TorchParker unless `park`
    is False. `turns` records each turn as [lease id, requested, granted, yielded]."""

    def __init__(
        self,
        baton: Baton | None = None,
        *,
        park: bool = True,
        acquire_timeout: float | None = None,
    ) -> None:
        self.parker = TorchParker() if park else None
        if baton is None:
            baton = Baton()
        if self.parker is not None:
            baton.register_callbacks(self.parker.park, self.parker.restore)
        self.baton = baton
        self.acquire_timeout = acquire_timeout
        self.turns: list[list[Any]] = []
        self._held: contextlib.ExitStack | None = None
        self._held_by = 0
        """The process that took the turn held (a forked DataLoader worker has a copy of it)."""
        self._fetching = False
        """True while a trainer without parking fetches a step's batches inside its turn."""
        self._pinned = 0
        """Open `turn()` blocks that took their turn: the trainer's events end none of it."""
        self._closed = False
        """True after `close()`: the process shares the GPU no more, and takes no turns."""
        self._off_turn = OffTurn(self._hand_back, self.begin)

    @property
    def holding(self) -> bool:
        """True while this callback holds a turn."""
        return self._held is not None

    def begin(self) -> None:
        """Acquire a turn unless one is held or the callback is closed (and hold parks off while
        it is). Interrupted (Ctrl-C) or failing once the grant came, before the turn is
        recorded, it gives the turn back, which no later `end()` would."""
        if self._held is not None or self._closed:
            return
        stack = contextlib.ExitStack()
        requested, pid = time.time(), os.getpid()
        already = self.baton.lease  # held before (the user's own acquire): not this call's
        try:
            lease = self._through_restarts(lambda: self.baton.acquire(self.acquire_timeout))
            if self.parker is not None:
                stack.enter_context(self.parker.in_use())
            self.turns.append([lease.lease_id, requested, time.time(), 0.0])
            self._held, self._held_by = stack, pid
        except BaseException:
            stack.close()
            if already is None and self.baton.lease is not None:
                with contextlib.suppress(BatonError):  # the interrupt is the one to see
                    self.baton.yield_()
            raise

    def end(self) -> None:
        """Hand the turn back, if one is held. Interrupted (Ctrl-C) once the turn is marked no
        longer held, before its yield leaves, it yields all the same: no later `end()` would,
        and the agent would keep the turn held until its --max-hold."""
        held = self._held
        if held is None:
            return
        try:
            self._stop_holding()
            self._through_restarts(self.baton.yield_)
        except BaseException as exc:
            if self._held is None and not isinstance(exc, BatonError):
                held.close()  # (done already unless the interrupt came before it)
                if self.baton.lease is not None:  # (else the yield took it, or it was lost)
                    with contextlib.suppress(BatonError):  # the interrupt is the one to see
                        self.baton.yield_()
            raise

    def _through_restarts(self, call: Callable[[], T]) -> T:
        """`call()`, made again while the agent restarts under it (the client reconnects on its
        own; the trainer cannot retry a call made inside `train()`), but not when the agent was
        never reached: that error is the one to see at once."""
        try:
            return call()
        except AgentUnavailable:
            if not self.baton.opened:
                raise
        return across_agent_restarts(call)

    def _stop_holding(self) -> bool:
        """End the device work of the turn held, if one is, without yielding it; True if one
        was."""
        held, self._held = self._held, None
        if held is None:
            return False
        self.turns[-1][3] = time.time()  # the device work ended: the yield is the handover's
        held.close()
        return True

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """A turn for device work outside the training loop (building the trainer, evaluating,
        saving), held until the block ends: the events of a trainer called inside it (the
        `on_log` and `on_evaluate` of an `evaluate()`) do not end it."""
        if self._held is not None or self._closed:
            yield
            return
        self.begin()
        self._pinned += 1
        try:
            yield
        finally:
            self._pinned -= 1
            self.end()

    def off_turn(self, fn: F) -> F:
        """Wrap a plain-Python reward function, `async` or not (or a data collator), so the GPU
        goes to another job while it runs; overlapping calls hand the turn back once. In a
        forked DataLoader worker it just runs: the turn is the parent's; so does a collator
        without parking (`park=False`), inside the turn of the batch fetch."""
        return self._off_turn.wrap(fn)

    def _hand_back(self) -> bool:
        """End the turn held for an off-turn call; False if there is none this process may
        hand back (a worker's copy, or the batch fetch's turn without parking)."""
        if self._held is None or self._held_by != os.getpid() or self._fetching:
            return False
        self.end()
        return True

    def close(self) -> None:
        """Leave the agent: what the parker holds parked comes back first, in one last turn
        (the one held, or one taken for it), and the session ends inside that turn, so nothing
        is parked again and the models are whole on the device after it. From then on the
        callback takes no turns: the watched trainer's methods and events run as plain calls.
        A park the agent asked for meanwhile (another job's turn needs the room) finishes
        first, and what it parked comes back in that last turn too. If that turn does not come
        (a Ctrl-C, its timeout, the agent away past the retries) it raises and leaves the
        callback open, the memory parked: its turns and a later `close()` bring it back."""
        if self._closed:
            return
        self._closed = True
        parker = self.parker
        try:
            self._stop_holding()
            if parker is not None and self.baton.close_unless(lambda: parker.parked):
                self._last_turn(parker)
        finally:
            if self._closed:
                self.baton.close()

    def _last_turn(self, parker: TorchParker) -> None:
        """Take the turn whose grant restores `parker`, for `close()`; if none comes, reopen
        (the session is still up): parked memory only a turn can bring back stays reachable."""
        try:
            self._through_restarts(lambda: self.baton.acquire(self.acquire_timeout))
        except BaseException:
            if parker.parked:
                self._closed = False
                if self.baton.lease is not None:  # granted as it was cut, not restored
                    with contextlib.suppress(BatonError):  # the error is the one to see
                        self.baton.yield_()
            raise

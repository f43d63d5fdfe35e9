"""Carrying out a plan: its parks and restores through the backend, retried with backoff.

A move that blocks (a copy through the driver, a file copy) runs in a worker thread. A plan's
consecutive such moves, and the read of the tenants they moved, run in one worker-thread call:
a handover that parks one tenant and restores another hands the work to another thread and back
once instead of three times, and each crossing is a wake-up that costs more than a small move
where the node's CPUs are busy. A move that fails there is retried on its own, as any move is;
the moves after it in that call are not made. Moves through a tenant's own callbacks
(`moves_on_loop`) run on the event loop, one at a time; only such a restore may be left to the
tenant as its grant arrives (`hand_restore`).

A plan cancelled (the agent stopping) makes no further move, but the move under way in a worker
thread cannot be stopped: the plan waits for it to end before it reads the tenants it moved and
gives up the node, so that the model, the saved parked record and the next plan see where that
move left the tenant.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from agent.core.errors import Quarantined
from agent.core.planner import Plan, Reason, Refusal, Step
from agent.core.residency import MoveFailed, NoRoom, TooLarge
from agent.parking.backends.base import BackendError, BackendQuarantined, Move, Unparkable
from agent.parking.from_model import ModelPlans
from agent.parking.known import counted
from agent.parking.model import Read
from baton.contract.tasks import to_the_end

log = logging.getLogger(__name__)

T = TypeVar("T")

Made = tuple[list[Move], Exception | None, Read | None]
"""A worker thread's share of a plan: the moves made in order (each counted and logged as it
ended, as on the event loop), the error of the one that failed (the rest not made), and the read
of the moved tenants (when all were made and it was asked)."""


class PlanMoves(ModelPlans):
    """Runs plans' moves; `ParkingPreparer` draws the plans."""

    async def _carry_out(
        self, tenant_id: str, plan: Plan | Refusal, when: str, handed: bool = False
    ) -> None:
        """Run the plan's moves in order, or record and raise the refusal; `handed`: leave the
        tenant's own restores to it where its method allows."""
        if isinstance(plan, Refusal):
            raise self._refuse(tenant_id, plan.reason, plan.message)
        if not plan.steps:  # the snapshot the plan came from is current: nothing to re-read
            return
        moved = {step.tenant_id for step in plan.steps}
        read: Read | None = None
        with counted(self._in_motion, moved):  # after: the model has them where the moves left them
            try:
                steps = list(plan.steps)
                while steps:
                    batch = self._off_loop(steps)
                    if batch:
                        del steps[: len(batch)]
                        read = await self._moves_aside(
                            tenant_id, batch, when, () if steps else moved
                        )
                        continue
                    step = steps.pop(0)
                    if handed and self._hand_over(tenant_id, step):
                        log.info("restore of %s on %s is left to its grant", tenant_id, step.gpu)
                        continue
                    await self._move(tenant_id, step, when)
            finally:  # what the moves changed (the plan was drawn from a full read just before)
                await self._read_moved(moved, read)
                if self._host is not None:
                    self._host.persist()

    def moving(self, tenant_id: str) -> bool:
        """Whether a plan is moving the tenant's memory now (the model has it where it was
        until the plan's moves are made and read)."""
        return tenant_id in self._in_motion

    def _off_loop(self, steps: Sequence[Step]) -> list[Step]:
        """The steps from the first that run in a worker thread, one after another, up to a move
        on the event loop (a restore that may be left to its tenant is one: `hand_restore`)."""
        batch = []
        for step in steps:
            if self.backend.moves_on_loop(step.tenant_id):
                break
            batch.append(step)
        return batch

    async def _moves_aside(
        self, tenant_id: str, steps: list[Step], when: str, then_read: set[str] | tuple[()]
    ) -> Read | None:
        """Make `steps` in one worker-thread call, reading the tenants `then_read` after them
        there (if the backend's reads block); the read, if made. A failed move is retried here,
        and the steps after it are made one at a time."""
        ids = None  # no read there: `_read_moved` makes it
        if then_read and self.backend.reads_block:
            counted = self._counted()
            ids = sorted(t for t in then_read if t in counted)
        stop = threading.Event()  # a cancelled caller: the thread makes no further move
        generation = self._model.generation

        def ended(done: asyncio.Future[Made]) -> None:  # in a cancelled plan
            if done.exception() is None:
                made, error, _ = done.result()
                if error is not None:
                    self._failed_cancelled(steps[len(made)], error)

        made, error, read = await in_thread(
            self._make, steps, when, stop, ids, generation, stop=stop, ended=ended
        )
        if error is None:
            return read
        rest = steps[len(made) :]
        await self._move(tenant_id, rest[0], when, failed=error)
        for step in rest[1:]:
            await self._move(tenant_id, step, when)
        return None

    def _make(
        self,
        steps: list[Step],
        when: str,
        stop: threading.Event,
        ids: list[str] | None,
        generation: int,
    ) -> Made:
        """In a worker thread: the moves, each counted and logged as it ends, then the read of
        `ids` (None: no read)."""
        made: list[Move] = []
        for step in steps:
            if stop.is_set():
                return made, None, None
            self._starts(step)
            try:
                move = self._mover(step)(step.tenant_id, step.gpu)
            except Exception as exc:  # retried, or raised, on the event loop (`_move`)
                return made, exc, None
            self._made(move, when, step.method or self.backend.method_of(step.tenant_id))
            made.append(move)
        if ids is None or stop.is_set():  # a cancelled plan reads where it ends, on the loop
            return made, None, None
        return made, None, self._read(ids, generation)

    def _hand_over(self, tenant_id: str, step: Step) -> bool:
        """Leave the step to the granted tenant if it is its own restore and its method allows
        (`hand_restore`); whether it was. The bytes stay held in the host budget until the
        tenant's turn there ends: only its yield says whether the restore was made."""
        if step.tenant_id != tenant_id or step.direction != "restore":
            return False
        move = self.backend.hand_restore(tenant_id, step.gpu)
        if move is None:
            return False
        method = step.method or self.backend.method_of(tenant_id)
        self.metrics.moved(move, "handed", method, timed=False)
        if move.bytes:  # its restore may fail (`not_restored`): held in the budget meanwhile
            self._promised.setdefault(tenant_id, {})[step.gpu] = move.bytes
            self._revision += 1
        return True

    async def _move(
        self, tenant_id: str, step: Step, when: str, failed: Exception | None = None
    ) -> Move:
        """One park or restore, retried with backoff; the tenant stays where it was on failure.
        `failed`: its first attempt was made already (in a worker thread) and raised this."""
        fn = self._mover(step)
        method = step.method or self.backend.method_of(step.tenant_id)
        if failed is None:
            self._starts(step)
        for attempt in range(self._attempts):
            try:
                if failed is not None:
                    error, failed = failed, None
                    raise error
                if self.backend.moves_on_loop(step.tenant_id):
                    move = await self.backend.move_on_loop(step.tenant_id, step.gpu, step.direction)
                else:
                    move = await in_thread(
                        fn,
                        step.tenant_id,
                        step.gpu,
                        ended=lambda done: self._failed_cancelled(step, done.exception()),
                    )
            except (BackendQuarantined, Unparkable) as e:  # retrying cannot help
                self.metrics.failed(step.direction, method)
                log.error("%s of %s on %s: %s", step.direction, step.tenant_id, step.gpu, e)
                if isinstance(e, BackendQuarantined):
                    self.quarantines.note(step.tenant_id, str(e))
                if step.tenant_id == tenant_id and isinstance(e, BackendQuarantined):
                    raise self._refuse_quarantined(tenant_id) from e
                raise self._refuse(
                    tenant_id,
                    "quarantined" if isinstance(e, BackendQuarantined) else Reason.UNPARKABLE,
                    f"{step.direction} of {step.tenant_id} on {step.gpu} by {method} failed: {e}",
                ) from e
            except BackendError as e:
                if self._left(step):  # forgotten, not moved
                    return Move(step.tenant_id, step.gpu, step.direction, 0, 0.0)
                self.metrics.failed(step.direction, method)
                log.warning(
                    "%s of %s on %s failed (attempt %d of %d): %s",
                    step.direction, step.tenant_id, step.gpu, attempt + 1, self._attempts, e,
                )  # fmt: skip
                if attempt + 1 == self._attempts:
                    raise self._refuse(
                        tenant_id,
                        "move_failed",
                        f"{step.direction} of {step.tenant_id} on {step.gpu} by {method} "
                        f"failed {self._attempts} times; last error: {e}",
                    ) from e
                await asyncio.sleep(self._backoff * 2**attempt)
            else:
                self._made(move, when, method)
                return move
        raise AssertionError("unreachable")

    def _failed_cancelled(self, step: Step, error: BaseException | None) -> None:
        """A move that failed in a worker thread as its plan was cancelled (`error`, if any):
        counted and logged as a failed move is, its quarantine noted; not tried again. A tenant
        that left meanwhile is skipped, as `_move` skips it."""
        if error is None:
            return
        retried = isinstance(error, BackendError) and not isinstance(
            error, BackendQuarantined | Unparkable
        )
        if retried and self._left(step):  # as `_move` skips it
            return
        self.metrics.failed(step.direction, step.method or self.backend.method_of(step.tenant_id))
        log.warning(
            "%s of %s on %s failed as its plan was cancelled (not tried again): %s",
            step.direction, step.tenant_id, step.gpu, error,
        )  # fmt: skip
        if isinstance(error, BackendQuarantined):
            self.quarantines.note(step.tenant_id, str(error))

    def _mover(self, step: Step) -> Callable[[str, str], Move]:
        """The backend's blocking call that makes `step`: its park or its restore."""
        return self.backend.park if step.direction == "park" else self.backend.restore

    def _starts(self, step: Step) -> None:
        log.info(
            "%s of %s on %s by %s starts (%d bytes)",
            step.direction, step.tenant_id, step.gpu,
            step.method or self.backend.method_of(step.tenant_id), step.bytes,
        )  # fmt: skip

    def _made(self, move: Move, when: str, method: str) -> None:
        self.metrics.moved(move, when, method)
        log.info(
            "%s %s on %s: %d bytes in %.3f s",
            move.direction, move.tenant_id, move.gpu, move.bytes, move.seconds,
        )  # fmt: skip

    def _left(self, step: Step) -> bool:
        """Whether the step's tenant left while its move failed: the host no longer counts it
        (its last session ended). Logged: the move is skipped."""
        if self._host is None or step.tenant_id in self._host.tenant_refs():
            return False
        log.info("%s left during its %s: skipped", step.tenant_id, step.direction)
        return True

    def _refuse(self, tenant_id: str, reason: str, message: str) -> NoRoom:
        """Count (once per reason while the turn waits), log (once per new message) and show
        why `tenant_id` waits; the error to raise."""
        if self._refused.get(tenant_id) != reason:
            self.metrics.refused.labels(reason).inc()
        self._refused[tenant_id] = reason
        if reason == Reason.TOO_LARGE:  # the turn ends here: the tenant's next ask is another
            del self._refused[tenant_id]
        if self._waiting.get(tenant_id) != message:
            log.warning("turn for %s waits: %s", tenant_id, message)
        self._waiting[tenant_id] = message
        if reason == "move_failed":
            return MoveFailed(message)
        return TooLarge(message) if reason == Reason.TOO_LARGE else NoRoom(message)

    def _refuse_quarantined(self, tenant_id: str) -> Quarantined:
        """The error for a turn of a quarantined tenant; counted and shown like a refusal."""
        why = self.quarantines.why[tenant_id]
        self._refuse(tenant_id, "quarantined", f"{tenant_id} takes no more turns: {why}")
        self._refused.pop(tenant_id, None)  # the turn ends here: the next ask is another
        return Quarantined(f"{tenant_id} takes no more turns: {why}")


async def in_thread(
    fn: Callable[..., T],
    *args: Any,
    stop: threading.Event | None = None,
    ended: Callable[[asyncio.Future[T]], None] | None = None,
) -> T:
    """`fn(*args)` in a worker thread (as `asyncio.to_thread`), for a call that moves memory.
    Cancelled, it sets `stop` (no further move) and waits for the thread to end first: the move
    under way cannot be stopped, and the node is not given up until it has ended; `ended` is
    then given the call's outcome (a failed move is still counted and logged)."""
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    future = asyncio.get_running_loop().run_in_executor(None, call)
    try:
        return await asyncio.shield(future)  # (the future itself: no task between)
    except asyncio.CancelledError:
        if stop is not None:
            stop.set()
        await to_the_end(future)
        if not future.cancelled():
            future.exception()  # retrieved: where the move left the tenant is for the read
            if ended is not None:
                ended(future)
        raise

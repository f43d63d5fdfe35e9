"""What this process has parked itself, for the clients that restore with their grants.

A client that asks for its turn with `restores_with_grant` restores, before `acquire` returns,
every GPU it parked and has not restored: the agent may leave that restore to it. A park asked
of a GPU still parked is refused while an acquire of this process is in flight (a revocation
that overtook the restore its grant owes: the agent asks again and finds the memory restored);
with none in flight (a grant that left the restore to this process never reached it, or the
restore failed and the turn was given back) it is answered at once with what that park moved.
A restore asked of a GPU this process has not parked since it last restored it (the agent gave
up on that restore as late, then asked again), or has never parked (the agent asks every parking
process of a tenant, and this one joined after the park), is answered at once with nothing
moved: running it would restore memory that is back already, or was never parked.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

from agent.client.errors import BatonError
from agent.client.types import Callback, run_callback
from baton._pb import agent_pb2 as pb
from baton.contract.tasks import to_the_end

log = logging.getLogger("baton.client")

_MOVE: contextvars.ContextVar[object | None] = contextvars.ContextVar("baton_move", default=None)
"""The park or restore (`Moves.move`) that the code running now is inside of, if any."""


def given_back(exc: BaseException, failed: BatonError | None) -> BaseException:
    """What `acquire` raises when its restore stopped with `exc` and it gave the turn back (or
    giving it back `failed`): a `BatonError` that says so, or the interruption itself."""
    if failed is not None:
        return BatonError(f"{exc}; giving the turn back failed too: {failed}")
    if isinstance(exc, BatonError):
        return BatonError(f"{exc}; the turn was given back")
    return exc


async def restore_with_grant(
    parked: Parked,
    move: Callable[[pb.Callback], Awaitable[pb.CallbackResult]],
    give_back: Callable[[], Awaitable[None]],
) -> None:
    """`AsyncBaton.acquire`'s restore of what its process parked (the agent left it to the
    grant). A failure gives the turn back and raises `BatonError` naming the GPU; a cancellation
    lets the restore in flight finish (its memory lands inside the turn), gives the turn back
    and goes on."""

    async def restore() -> None:
        for gpu in parked.gpus():
            result = await move(pb.Callback(action="restore", gpu=gpu))
            if result.error:
                raise BatonError(f"on_restore({gpu}) failed: {result.error}")

    restoring = asyncio.ensure_future(restore())
    try:
        await asyncio.shield(restoring)
    except BaseException as exc:  # interrupted too: the turn is not used unrestored
        # A second cancel (a timeout, then a shutdown) cuts neither the restore nor the give-back.
        await to_the_end(restoring)
        if not restoring.cancelled():
            restoring.exception()  # its failure is `exc`, or is superseded by it
        giving = asyncio.ensure_future(give_back())
        await to_the_end(giving)
        failed = None if giving.cancelled() else giving.exception()
        if failed is not None and not isinstance(failed, BatonError):
            raise failed from exc
        raise given_back(exc, failed) from (exc if failed else None)


def restores_itself(callbacks: Mapping[str, Any]) -> bool:
    """Whether a client with these callbacks parks and restores itself (has both), and so may
    ask to restore with its grants."""
    return {"park", "restore"} <= callbacks.keys()


class Parked:
    """GPU → bytes its park moved, for each GPU this process parked and has not restored."""

    def __init__(self) -> None:
        self.bytes: dict[str, int] = {}
        self._restored: set[str] = set()
        """GPUs this process restored and has not parked since."""
        self._acquiring = 0
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self.bytes)

    def gpus(self) -> list[str]:
        return sorted(self.bytes)

    def copy(self) -> dict[str, int]:
        """GPU → bytes, as now (a copy: a callback on another thread may change it)."""
        return dict(self.bytes)

    @contextlib.contextmanager
    def acquiring(self) -> Iterator[None]:
        """Around an acquire and the restore its grant owes."""
        with self._lock:
            self._acquiring += 1
        try:
            yield
        finally:
            with self._lock:
                self._acquiring -= 1

    def instead(self, request: pb.Callback) -> pb.CallbackResult | None:
        """The answer to give without running the callback (see the module docstring); None:
        run it. A restore without a call id is one a grant owes."""
        gpu = request.gpu
        if request.action == "park" and gpu in self.bytes:
            with self._lock:
                acquiring = self._acquiring
            if acquiring:
                why = "still parked, its restore comes with a grant in flight"
                return pb.CallbackResult(
                    call_id=request.call_id, error=f"on_park({gpu}) not run: {why}"
                )
            return pb.CallbackResult(call_id=request.call_id, bytes=self.bytes[gpu])
        if request.action == "restore" and gpu not in self.bytes:
            if request.call_id and gpu in self._restored:
                log.info("on_restore(%s) not run: restored already (a late restore finished)", gpu)
            # Else restored by a callback meanwhile (a restore a grant owes), or never parked
            # by this process (the agent asks every parking process of the tenant, and this one
            # joined after the park): nothing of it to bring back.
            return pb.CallbackResult(call_id=request.call_id)
        return None

    def ran(self, request: pb.Callback, result: pb.CallbackResult) -> None:
        """A callback ran: note what it parked or restored."""
        if result.error:
            return
        if request.action == "park":
            self.bytes[request.gpu] = int(result.bytes)
            self._restored.discard(request.gpu)
        elif request.action == "restore":
            self.bytes.pop(request.gpu, None)
            self._restored.add(request.gpu)


class Moves:
    """`AsyncBaton`'s parks and restores (a callback, or the restore `acquire` makes): one at a
    time, keeping `parked` up to date."""

    def __init__(self, callbacks: Mapping[str, Callback]) -> None:
        self.parked = Parked()
        self._callbacks = callbacks
        self._one_at_a_time = asyncio.Lock()
        self._in_flight: object | None = None
        """The park or restore in flight, if any (`_MOVE` inside it)."""

    def moving_here(self) -> bool:
        """Whether this runs inside the park or restore in flight (its callback calls close(),
        on its task or one it started): the others asked for wait for it to end first."""
        return self._in_flight is not None and _MOVE.get() is self._in_flight

    async def move(self, request: pb.Callback) -> pb.CallbackResult:
        """Run a park or restore."""
        async with self._one_at_a_time:
            self._in_flight = here = object()
            inside = _MOVE.set(here)
            try:
                result = self.parked.instead(request)
                if result is None:
                    result = await run_callback(self._callbacks.get(request.action), request)
                    self.parked.ran(request, result)
                return result
            finally:
                _MOVE.reset(inside)
                self._in_flight = None


def refused(request: pb.Callback) -> pb.CallbackResult:
    """The answer to a callback the agent asks for as the client closes: not run."""
    error = f"the tenant is closing its Baton client: on_{request.action} not run"
    return pb.CallbackResult(call_id=request.call_id, error=error)


async def settled(moves: Moves, moving: set[asyncio.Task[None]], timeout: float) -> None:
    """Wait up to `timeout` for the callbacks in flight (and their answers) as a client closes;
    not from inside one (`moves.moving_here()`): the others wait for it to end, and it for this."""
    if moves.moving_here():
        return
    moving = moving - {asyncio.current_task()}  # (closed by its own task, after its move)
    if moving and (await asyncio.wait(moving, timeout=timeout))[1]:
        log.error(
            "a park or restore still runs %.3g s after this AsyncBaton client began closing; "
            "closing anyway (is the framework's offload stuck?)", timeout,
        )  # fmt: skip

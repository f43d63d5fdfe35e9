"""`AsyncBaton`: the asyncio client of the node agent.

The session's reads, writes and timers run on the caller's event loop
(`agent.client.aio_session`); what they do to the turn is decided in
`agent.client.session_core`, as for the blocking client."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Sequence

from agent.client.aio_session import AsyncSession
from agent.client.connect import usable
from agent.client.errors import (
    AcquireTimeout,
    AgentUnavailable,
    BatonError,
    LeaseLost,
    NotHolding,
)
from agent.client.parked import restore_with_grant, restores_itself
from agent.client.session_core import acquire_request
from agent.client.types import (
    ENDED_BY_ERROR,
    REPLY_TIMEOUT_S,
    Callback,
    LeaseInfo,
    acquire_args,
    add_callbacks,
    turn_block,
)
from baton._pb import agent_pb2 as pb

log = logging.getLogger("baton.client")
_ANOTHER_ACQUIRE = "another task's acquire on this client was still waiting"
_PARK_OF_A_YIELD = "a yield cancelled in its park waited for that park (on_park) to end"


async def _within(wait: Awaitable[object], deadline: float | None, why: str) -> None:
    """Await `wait` until `deadline` (the loop's time; None: no limit); `AcquireTimeout`
    saying `why` it waited if it is not done by then."""
    left = None if deadline is None else max(0.0, deadline - asyncio.get_running_loop().time())
    try:
        await asyncio.wait_for(wait, left)
    except TimeoutError:
        raise AcquireTimeout(f"no turn within the timeout; it waited because {why}") from None


class AsyncBaton(AsyncSession):
    """Takes turns on this tenant's GPUs: `await acquire()`, `await yield_()`, `turn()`.

    Tasks sharing one client share its turn, as threads share a `Baton`'s."""

    _acquiring: asyncio.Lock | None = None
    """Held by the acquire that asks the agent; the others made meanwhile wait for its grant."""
    _parking_yield: asyncio.Task[None] | None = None
    """The yield of a `yield_` cancelled in its park, which runs on until the park is done."""

    @property
    def lease(self) -> LeaseInfo | None:
        """The turn held now, if any (none once closed or its loop ended: the agent took it)."""
        return None if self._ended() else self._core.lease

    @property
    def resuming(self) -> bool:
        """True after a revocation, until the agent hands the turn back."""
        return self._core.resuming and not self._ended()

    def _ended(self) -> bool:
        """Closed, or its session's event loop ended (`asyncio.run` returned) or it stopped for
        good (`reconnect=False`): what it held went back to the agent with the session."""
        session = self._supervisor
        return self._closing or (
            session is not None and (session.done() or session.get_loop().is_closed())
        )

    def _ended_with_loop(self) -> bool:
        """Its session's task was cancelled, as `asyncio.run` cancels the tasks left as it
        returns: the agent took the turn back with the session."""
        return self._supervisor is not None and self._supervisor.cancelled()

    def register_callbacks(
        self, on_park: Callback | None = None, on_restore: Callback | None = None
    ) -> None:
        """Callbacks the agent may ask for: move this tenant's memory off / back onto a GPU.

        Each gets the GPU UUID and returns the bytes it moved. Register before connecting.
        """
        add_callbacks(self._callbacks, self._link is not None, on_park, on_restore)

    async def connect(self) -> None:
        """Open the session (done by the first `acquire` if not called)."""
        self._owner.check()  # (a forked child's copy of an open session: the parent's)
        await super().connect()

    async def acquire(
        self, timeout: float | None = None, gpus: Sequence[str] | str | None = None
    ) -> LeaseInfo:
        """Wait for the turn on all the tenant's GPUs (or `gpus`); `AcquireTimeout` if too long.
        With an on_restore callback, whatever this process parked is restored before this
        returns (as `Baton.acquire` does)."""
        self._owner.check()
        timeout, gpus = acquire_args(timeout, gpus)
        # Closed, or its loop ended: a turn it held went back with its session, is held no more.
        usable(self._closing, self._supervisor)
        if self._ended():  # its session over for good (reconnect=False): the turn went with it
            raise AgentUnavailable(
                f"the session with the Baton agent at {self.socket} ended, and this client does "
                "not reconnect (reconnect=False); create a new one"
            )
        settled = self._kept_yield is None or self._kept_yield.done()  # (else: `_acquire`)
        if settled and (held := self._core.held(gpus)) is not None:  # another task's grant too
            return held
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        if self._acquiring is None:
            self._acquiring = asyncio.Lock()
        if self._acquiring.locked():  # another task's acquire waits: its grant is this one's too
            await _within(self._acquiring.acquire(), deadline, _ANOTHER_ACQUIRE)
        else:
            await self._acquiring.acquire()  # (free: taken at once, even with timeout 0)
        try:
            return await self._acquire(deadline, gpus)
        finally:
            self._acquiring.release()

    async def _acquire(self, deadline: float | None, gpus: Sequence[str] | None) -> LeaseInfo:
        """`acquire`, one task at a time: the turn held (another task's grant), or a new one
        asked for by `deadline` (the loop's time; None: no limit)."""
        if (kept_yield := self._kept_yield) is not None and not kept_yield.done():
            if kept_yield is self._parking_yield:  # a yield cancelled in its park ends the turn
                await _within(asyncio.wait([kept_yield]), deadline, _PARK_OF_A_YIELD)  # first
            else:  # a yield being written (a kept turn given back): a moment, whatever timeout
                await asyncio.wait([kept_yield])
        if (held := self._core.held(gpus)) is not None:  # (a park meanwhile: a revocation's)
            return held
        loop = asyncio.get_running_loop()
        timeout = None if deadline is None else max(0.0, deadline - loop.time())
        if (unsure := self._core.unsure_held()) is not None:  # its yield was cut off
            if (held := await self._settled(unsure, timeout, gpus)) is not None:
                return held
            timeout = None if deadline is None else max(0.0, deadline - loop.time())
        with self._kept_lock:
            kept = self._core.take_kept(gpus)
            release = None if kept is not None else self._core.give_back()
        if kept is not None:
            self._rearm()
            return kept
        self._yield_kept(release)  # not taken back: its yield is written first
        if self._kept_yield is not None:
            await asyncio.wait([self._kept_yield])
        if self._withdrawal is not None:  # an acquire given up on leaves the queue first
            await asyncio.wait([self._withdrawal])
        if not self._backstop.released.is_set():  # given back off the loop: answered first
            await asyncio.to_thread(self._backstop.released.wait, REPLY_TIMEOUT_S)
        restores = restores_itself(self._callbacks)
        with self.parked.acquiring():
            request = acquire_request(timeout, gpus, self.job, restores, self._core.owed())
            reply = await self._request(request, timeout, slack=5)
            lease = self._core.granted(LeaseInfo.from_pb(reply.lease), gpus)
            self._rearm()
            if restores and self.parked:
                await restore_with_grant(self.parked, self._moves.move, self.yield_)
        return lease

    async def _settled(
        self, lease: LeaseInfo, timeout: float | None, gpus: Sequence[str] | None
    ) -> LeaseInfo | None:
        """`lease`, held again after its yield was cut off, once the agent, asked after the
        reconnect, says it still has it (None: the yield had ended it: a new turn is due)."""
        renew = pb.Request(renew=pb.RenewRequest(lease_id=lease.lease_id))
        outcome: LeaseInfo | BatonError
        try:
            outcome = LeaseInfo.from_pb((await self._request(renew, timeout, slack=5)).lease)
        except AgentUnavailable:
            raise
        except BatonError as exc:  # LeaseLost, TurnRevoked: the core's to judge
            if self._closing:  # closed meanwhile: no renewal to arm again
                raise
            outcome = exc
        self._core.renewed(lease, outcome, reclaiming=True)
        self._rearm()
        return self._core.held(gpus)

    async def yield_(self) -> None:
        """End the turn. Parking is lazy: memory moves only if the next tenant needs the room."""
        self._owner.check()
        parked = {}  # what the tenant due next needs gone, parked before the turn ends
        if gpus := self._core.parks_at_yield():
            parks = asyncio.ensure_future(self._park_at_yield(gpus))  # runs on if cancelled
            try:
                parked = await asyncio.shield(parks)
            except asyncio.CancelledError:  # the turn goes back once its park is done
                self._kept_yield = self._parking_yield = self._spawn(self._yield_after(parks))
                raise
        with self._kept_lock:
            ended = self._core.begin_yield(may_keep=not parked)
        self._rearm()
        if ended.kept:
            self._backstop.poke()  # given back by the loop's timer, or off it if it is blocked
        if ended.kept or ended.gone:  # nothing to send (kept: the timer yields it if no
            return  # acquire takes it back; gone: its earlier yield reached the agent)
        release = self._core.release(ended.named, parked)
        try:
            await self._request(pb.Request(release=release))
        except LeaseLost:
            if not self._core.ended_unheard(ended):
                raise
        except AgentUnavailable:  # the turn may outlive the agent's restart: yield can be retried
            self._core.yield_failed(ended)
            self._rearm()
            for gpu in parked:  # held again: what this yield parked comes back first
                await self._moves.move(pb.Callback(action="restore", gpu=gpu))
            raise
        except asyncio.CancelledError:  # perhaps before the yield was written: it goes again
            again = pb.Request(request_id=next(self._core.ids), release=release)
            self._yield_kept(again)  # (the next acquire waits for it; a second one is refused)
            raise

    async def _park_at_yield(self, gpus: Sequence[str]) -> dict[str, int]:
        """Park `gpus` as the turn ends (the agent's hint): GPU → bytes parked."""
        parked = {}
        for gpu in gpus:
            result = await self._moves.move(pb.Callback(action="park", gpu=gpu))
            if not result.error:
                parked[gpu] = int(result.bytes)
        return parked

    async def _yield_after(self, parks: asyncio.Future[dict[str, int]]) -> None:
        """A yield cancelled during its park: the turn is yielded once the park is done,
        naming what it parked (the next `acquire` waits for this)."""
        try:
            parked = await parks
        except Exception:  # (errors are the callbacks' answers: only a crash lands here)
            parked = {}
        try:
            with self._kept_lock:
                ended = self._core.begin_yield(may_keep=False)
        except NotHolding:  # it ended meanwhile (the session closed, a revocation)
            return
        self._rearm()
        if not ended.gone:
            release = self._core.release(ended.named, parked)
            await self._send_kept(pb.Request(request_id=next(self._core.ids), release=release))

    @contextlib.asynccontextmanager
    async def turn(self, timeout: float | None = None) -> AsyncIterator[LeaseInfo]:
        """`async with baton.turn(): ...` or, as a decorator, `@baton.turn()`; nested in one
        task (or in tasks a block started), the turn is held until the outermost block ends."""
        with turn_block(self) as ends_turn:
            lease = await self.acquire(timeout)

            def ours() -> bool:  # (a forked child leaving through the block: the turn is the
                # parent's; a client closed in it, or its session ended with its event loop:
                # the agent took the turn back with the session)
                mine = ends_turn() and not self._owner.forked() and not self._closing
                return mine and not self._ended_with_loop() and self._core.holding()

            try:
                yield lease
            except BaseException as raised:
                if ours():
                    try:
                        await self.yield_()
                    except BatonError as exc:  # the block's own error is the one to tell
                        if not self._ended_with_loop():  # (else: went with the session)
                            log.warning(ENDED_BY_ERROR, type(raised).__name__, exc)
                raise
            if ours():
                await self.yield_()

    async def __aenter__(self) -> AsyncBaton:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

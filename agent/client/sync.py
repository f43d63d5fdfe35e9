"""`Baton`: the blocking client, on a direct session with the node agent.

The caller's thread writes its requests straight to the socket and waits for the answer
(`agent.client.call_link`); one background thread per client serves the session
(`agent.client.blocking_session`, on the socket of `agent.client.blocking_connection`);
`agent.client.session_core` keeps the turn's state. No event loop sits between the caller and
the socket, so a turn costs two small writes and one wake-up.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Sequence

from agent.client.blocking_session import BlockingSession, closed_error
from agent.client.call_link import CallLink, NotSent
from agent.client.errors import AcquireTimeout, AgentUnavailable, BatonError, LeaseLost
from agent.client.parked import given_back
from agent.client.session_core import acquire_request
from agent.client.types import (
    ENDED_BY_ERROR,
    REPLY_TIMEOUT_S,
    LeaseInfo,
    acquire_args,
    reply_wait,
    time_left,
    turn_block,
)
from baton._pb import agent_pb2 as pb
from baton.contract import framing

log = logging.getLogger("baton.client")

LINK_GRACE_S = 2.0
"""How long a call link that cannot reach the agent waits to see the session break too."""


class Baton(BlockingSession):
    """Takes turns on this tenant's GPUs: `acquire()`, `yield_()`, `with baton.turn(): ...`.

    Arguments default to `BATON_AGENT_SOCKET`, `BATON_GPUS` and `BATON_TENANT_NAME`.
    """

    def _request(
        self,
        request: pb.Request,
        timeout: float | None = None,
        slack: float = 0.0,
        answered: list[pb.Reply] | None = None,
    ) -> pb.Reply:
        """Send a request on the call link and wait up to `timeout` + `slack` for its answer.

        While the session is broken the request waits for the reconnect, up to `timeout` (or
        the connect timeout), and goes out with what is left of `timeout`; a link that breaks
        after the request left fails it. Only an
        acquire without a timeout waits for its answer without end (it is queued). The
        answer is put in `answered` as soon as it is read (`CallLink.call`).
        """
        deadline = time.monotonic() + (self._connect_timeout if timeout is None else timeout)
        while True:
            self._ready(deadline - time.monotonic())
            left = None if timeout is None else max(0.0, deadline - time.monotonic())
            reply_timeout = reply_wait(time_left(request, left), left, slack)
            with self._call_lock:
                try:
                    link = self._call_link()
                    return link.call(request, reply_timeout, answered)
                except NotSent as exc:
                    # The agent went away (the reader thread hears of it on the session and
                    # reconnects; then this request goes out again) or it refuses call links.
                    wait = min(LINK_GRACE_S, max(0.0, deadline - time.monotonic()))
                    if not self._disconnected.wait(wait):
                        raise AgentUnavailable(
                            f"cannot open a call link to the Baton agent at {self.socket} "
                            f"while its session is up: {exc.__cause__ or exc}"
                        ) from None
                except AgentUnavailable:
                    if self._closed.is_set():  # close() ended the session under this call
                        raise closed_error() from None
                    raise

    def _call_link(self) -> CallLink:
        """The open call link of the current session (opened now if needed)."""
        with self._state:
            link, token = self._link, self._token
        if link is not None and link.token == token and not link.closed:
            return link
        if link is not None:
            link.close()
        try:
            link = CallLink.open(self.socket, token, self._connect_timeout, self._core)
        except (OSError, ValueError, KeyError, framing.FrameError) as exc:
            raise NotSent from exc
        with self._state:
            self._link = link
        return link

    # The two calls.

    def acquire(
        self, timeout: float | None = None, gpus: Sequence[str] | str | None = None
    ) -> LeaseInfo:
        """Block until this tenant's turn; `AcquireTimeout` after `timeout` seconds (None or
        inf: no limit; a negative or NaN one raises `InvalidRequest`).

        With an on_restore callback, whatever this process parked is restored here, as the
        grant arrives, before this returns (the agent may leave that restore to it); a restore
        that fails gives the turn back and raises `BatonError` naming the GPU.
        """
        self._owner.check()
        timeout, gpus = acquire_args(timeout, gpus)
        if (held := self._core.held(gpus)) is not None:  # (a park meanwhile: a revocation's)
            return held
        start = time.monotonic()
        if not self._acquiring.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            raise AcquireTimeout(
                "no turn within the timeout; it waited because another thread's acquire on "
                "this client was still waiting"
            )
        try:
            left = None if timeout is None else max(0.0, timeout - (time.monotonic() - start))
            if (held := self._settled(left, gpus)) is not None:  # that thread's turn: shared
                return held
            left = None if timeout is None else max(0.0, timeout - (time.monotonic() - start))
            return self._acquire(left, gpus)
        finally:
            self._acquiring.release()

    def _settled(self, timeout: float | None, gpus: Sequence[str] | None) -> LeaseInfo | None:
        """The turn held, once sure: one whose yield was cut off (`SessionCore.unsure_held`)
        only once the agent, asked after the reconnect, says it still has it (None: the yield
        had ended it, and the acquire queues for a new turn)."""
        with self._state:
            lease = self._core.unsure_held()
        if lease is not None:
            renew = pb.Request(renew=pb.RenewRequest(lease_id=lease.lease_id))
            outcome: LeaseInfo | BatonError
            try:
                outcome = LeaseInfo.from_pb(self._request(renew, timeout, slack=5).lease)
            except AgentUnavailable:
                raise
            except BatonError as exc:  # LeaseLost, TurnRevoked: the core's to judge
                if self._closed.is_set():  # closed meanwhile: nothing to judge
                    raise
                outcome = exc
            with self._state:
                self._core.renewed(lease, outcome, reclaiming=True)
        return self._core.held(gpus)

    def _acquire(self, timeout: float | None, gpus: Sequence[str] | None) -> LeaseInfo:
        with self._state:
            if (kept := self._core.take_kept(gpus)) is None:  # not taken back: yielded first
                self._yield_kept(self._core.give_back())
        if kept is not None:
            return kept
        if not self._kept_released.wait(REPLY_TIMEOUT_S):  # so the agent reads it first
            raise AgentUnavailable(
                f"the Baton agent at {self.socket} did not answer the yield of a kept turn "
                f"within {REPLY_TIMEOUT_S:.3g} s"
            )
        restores = self._callbacks_run.restores
        with self._callbacks_run.parked.acquiring():
            with self._state:  # a revoked turn the agent gives back: this acquire's
                owed = self._core.owed()
            request = acquire_request(timeout, gpus, self.job, restores, owed)
            answered: list[pb.Reply] = []
            try:
                reply = self._request(request, timeout, slack=5, answered=answered)
                with self._state:
                    lease = self._core.granted(LeaseInfo.from_pb(reply.lease), gpus)
            except BaseException:  # Ctrl-C as the grant arrived, too: no turn held unknown
                self._give_back_grant(answered)
                raise
            if restores and self._callbacks_run.parked:
                self._restore_with_grant()
        return lease

    def _give_back_grant(self, answered: list[pb.Reply]) -> None:
        """An acquire that ends in an error once its grant was read (an interruption before or
        as it was recorded) gives the turn back, so that it is neither held by nobody until
        the agent's maximum hold nor held by a caller who was told it failed."""
        if not answered or not answered[-1].HasField("lease"):
            return
        grant = answered[-1].lease
        with self._state:
            held = self._core.lease
        try:
            if held is not None and held.lease_id == grant.lease_id:  # recorded: yielded
                self.yield_()
            elif (release := self._core.unclaimed(answered[-1])) is not None:
                self._request(release)  # as an answer nobody waits for is handed back
        except BatonError as exc:  # (the session's end gives it back too)
            log.warning("could not give back turn %s: %s", grant.lease_id, exc)

    def _restore_with_grant(self) -> None:
        try:
            self._callbacks_run.restore_parked()
        except BaseException as exc:  # interrupted too: the turn is not used unrestored
            failed = None
            try:
                self.yield_()
            except BatonError as e:
                failed = e
            raise given_back(exc, failed) from (exc if failed else None)

    def yield_(self) -> None:
        """End the turn. Parking is lazy: memory moves only if the next tenant needs the room."""
        self._owner.check()
        with self._state:
            gpus = self._core.parks_at_yield()
        try:
            parked = self._callbacks_run.park_for_yield(gpus) if gpus else {}
        except BaseException:  # Ctrl-C in the park: the turn goes back all the same, and the
            with contextlib.suppress(BatonError):  # agent parks by callback what it needs
                self._end_turn({})
            raise
        self._end_turn(parked)

    def _end_turn(self, parked: dict[str, int]) -> None:
        """`yield_` once its park at the yield ran: send the release naming what it `parked`."""
        with self._state:
            ended = self._core.begin_yield(may_keep=not parked)
        if ended.kept:  # nothing to send: the keeper yields it if no acquire takes it back
            self._keeper.poke()
            return
        if ended.gone:
            return
        release = self._core.release(ended.named, parked)
        try:
            self._request(pb.Request(release=release))
        except LeaseLost:
            if not self._core.ended_unheard(ended):
                raise
        except AgentUnavailable:  # the turn may outlive the agent's restart: yield can be retried
            with self._state:
                self._core.yield_failed(ended)
            if parked:  # held again: what this yield parked comes back before anything else
                with contextlib.suppress(BatonError):
                    self._callbacks_run.restore_parked()
            raise
        except BaseException as exc:  # a second Ctrl-C, say, perhaps before the yield left:
            if not isinstance(exc, BatonError):  # it goes again on the session (the next
                with self._state:  # acquire waits for its answer; a second one is refused)
                    self._yield_kept(pb.Request(release=release))
            raise

    @contextlib.contextmanager
    def turn(self, timeout: float | None = None) -> Iterator[LeaseInfo]:
        """`with baton.turn(): ...`, or as a decorator, `@baton.turn()`; nested on one thread,
        the turn is held until the outermost block ends."""
        with turn_block(self) as ends_turn:
            lease = self.acquire(timeout)

            def ours() -> bool:  # (a forked child leaving through the block: the turn is the
                # parent's; a client closed in it: the agent took the turn back with the session)
                mine = ends_turn() and not self._owner.forked() and not self._closed.is_set()
                return mine and self._core.holding()

            try:
                yield lease
            except BaseException as raised:
                if ours():
                    try:
                        self.yield_()
                    except BatonError as exc:  # the block's own error is the one to tell
                        log.warning(ENDED_BY_ERROR, type(raised).__name__, exc)
                raise
            if ours():
                self.yield_()

    # Lifecycle.

    def __enter__(self) -> Baton:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

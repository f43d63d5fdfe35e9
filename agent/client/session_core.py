"""The client session's state machine, written once with no I/O: what the tenant holds.

`Baton` (blocking) and `AsyncBaton` (asyncio) feed it what happens (a grant, a yield, the
agent's revocations and resumes, renewals and their answers, an answer nobody waits for) and do
what it hands back (a lease to renew, a turn to hand back); the clock is injected.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from agent.client.errors import BatonError, LeaseLost, NotHolding, Refused, TurnRevoked
from agent.client.types import LeaseInfo
from baton._pb import agent_pb2 as pb

log = logging.getLogger("baton.client")

TURN_MARGIN = 2.0
"""A kept lease is kept, and taken back, only while what remains of its maximum hold is this many
times its longest turn so far: the agent counts its kept turns as one lease, so a turn taken back
late would be revoked where, asked for, it is a lease of its own with the whole maximum hold."""


def acquire_request(
    timeout: float | None,
    gpus: Sequence[str] | None,
    job: str = "",
    restores: bool = False,
    revoked: str = "",
) -> pb.Request:
    """The acquire to send: the agent withdraws it after `timeout` (0 on the wire: no limit);
    with `job`, the turn of that whole job across its nodes; `restores`: the caller restores
    what it parked as the grant arrives (`restores_with_grant`); `revoked`: the lease whose
    turn the agent is to give back, which the acquire waits for (`SessionCore.owed`)."""
    timeout_ms = 0 if timeout is None else max(1, int(timeout * 1000))
    acquire = pb.AcquireRequest(
        gpus=gpus or (),
        timeout_ms=timeout_ms,
        job=job,
        restores_with_grant=restores,
        revoked_lease_id=revoked,
    )
    return pb.Request(acquire=acquire)


def _ask(gpus: Sequence[str] | None) -> tuple[str, ...] | None:
    return tuple(sorted(gpus)) if gpus else None


class Turn(NamedTuple):
    """What a yield ends: the lease held (None while resuming), whether a resume was due, and
    whether the lease is kept (`KeepTurn`: nothing to send)."""

    lease: LeaseInfo | None
    resuming: bool
    kept: bool = False
    gone: bool = False
    """The turn had ended already: its yield, cut off by an agent restart, reached the agent."""
    revoked: str = ""
    """While resuming: the revoked lease whose turn, not given back yet, the yield gives up."""

    @property
    def lease_id(self) -> str:
        return self.lease.lease_id if self.lease is not None else ""

    @property
    def named(self) -> str:
        """The lease the yield names: the one held, or the revoked one (only that turn ends,
        not those of the tenant's other processes)."""
        return self.lease_id or self.revoked


class KeptLease(NamedTuple):
    """A lease kept across a yield: the turn ended, the lease not yet given back."""

    lease: LeaseInfo
    asked: tuple[str, ...] | None
    """The GPUs its acquire named (None: all the tenant's); only the same ask takes it back."""
    since: float
    renew_at: float | None


class SessionCore:
    """The turn a tenant holds, its renewal deadline, and the rules that change them.

    Invariants: at most one lease is held or kept; never a lease and a pending resume at once;
    a renewal is due only while a lease is held.
    """

    def __init__(self, renew_interval: float, clock: Callable[[], float] = time.monotonic):
        self.renew_interval = renew_interval
        self.clock = clock
        self.lease: LeaseInfo | None = None
        """The turn held now, if any."""
        self.resuming = False
        """True after a revocation, until the agent hands the turn back."""
        self.revoked_id = ""
        """The lease whose revocation made it resume (the agent names it if it withdraws it)."""
        self.renew_at: float | None = None
        """When the held lease is next renewed; None while a renewal is on its way."""
        self.ids = itertools.count(1)
        """Request ids, shared by every connection of the session."""
        self.parked: Callable[[], Mapping[str, int]] = dict
        """What this process holds parked (GPU → bytes its park moved; `agent.client.parked`):
        every end of a turn tells the agent, so that memory a grant's restore never brought back
        is counted in host memory, not on the GPU."""
        self.park_at_yield = True
        """Whether a park the agent asks for at a yield (`ParkAtYield`) runs on the yielding
        thread before the yield leaves (False: every park waits for the agent's callback)."""
        self.yield_parks: tuple[str, tuple[str, ...]] = ("", ())
        """The lease whose end should park these GPUs first, as the agent last said
        (`ParkAtYield`: the tenant due next needs the room)."""
        self.keeps_turns = True
        """Whether a yield keeps the lease when the agent says it may (`KeepTurn`); the shell
        says so in its Hello."""
        self.allowance = pb.KeepTurn()
        """How long the held lease may be kept across yields, as the agent last said."""
        self.granted_clock = 0.0
        """When the held lease was granted, by `clock`."""
        self.turn_clock = 0.0
        """When the turn on it began (its grant, or the acquire that took it back kept)."""
        self.longest_turn = 0.0
        """The longest turn on the held lease so far (`TURN_MARGIN`)."""
        self.asked: tuple[str, ...] | None = None
        """The GPUs the held lease's acquire named (None: all the tenant's)."""
        self.kept: KeptLease | None = None
        """The lease kept at the last yield, until an acquire takes it back or it is given back
        (`agent.server.kept_turns`)."""
        self.unsure = ""
        """The lease of a yield cut off in flight (`yield_failed`): it may have reached the
        agent, so the agent's "no such lease" to the yield made again means it did."""
        self.gone = False
        """That lease was found gone (a renewal's "no such lease"): the yield made again ends it."""
        self.undelivered: pb.Request | None = None
        """A kept lease's yield that could not be sent (the session was down): sent again by
        the next `give_back`, after the reconnect."""

    def owed(self) -> str:
        """The revoked lease whose turn the agent is to give back ("": none); an acquire names
        it, so that it waits for that turn and holds it."""
        return self.revoked_id if self.resuming and self.lease is None else ""

    def holding(self) -> bool:
        """A turn to end: a lease held, or one the agent will give back."""
        return self.lease is not None or self.resuming

    # The caller's calls.

    def held(self, gpus: Sequence[str] | None) -> LeaseInfo | None:
        """The turn held now, which an acquire returns at once (None while it is `unsure_held`:
        the acquire asks the agent first); `Refused` if the acquire names other GPUs than it
        covers."""
        lease = self.lease
        if lease is not None and gpus and set(gpus) != set(lease.gpus):
            raise Refused(
                f"acquire(gpus={sorted(gpus)}) while this client holds a turn on "
                f"{list(lease.gpus)}: yield_() it first"
            )
        if self.unsure and lease is not None and lease.lease_id == self.unsure:
            return None
        return lease

    def unsure_held(self) -> LeaseInfo | None:
        """The lease held again after its yield was cut off (`yield_failed`), until a renewal
        says whether the agent still has it: an acquire returns it only once it does (the
        yield may have ended it, and the GPU be another tenant's)."""
        lease = self.lease
        return lease if lease is not None and lease.lease_id == self.unsure else None

    def granted(self, lease: LeaseInfo, asked: Sequence[str] | None = None) -> LeaseInfo:
        """An acquire (for `asked`, or all the tenant's GPUs) was answered: the turn is held,
        its renewal due after the interval."""
        self.lease, self.resuming = lease, False
        self.unsure, self.gone = "", False
        self.asked = _ask(asked)
        self.granted_clock = self.turn_clock = now = self.clock()
        self.longest_turn = 0.0
        self.renew_at = now + self.renew_interval
        return lease

    def begin_yield(self, may_keep: bool = True) -> Turn:
        """The caller yields: the turn ends now; the shell sends the release for `Turn`, unless
        the lease is kept (the agent said it may be, and `may_keep`: nothing was parked)."""
        if self.lease is None and not self.resuming:
            if self.gone:  # its yield reached the agent before the restart: nothing to end
                self.gone = False
                return Turn(None, False, gone=True)
            raise NotHolding("yield_() without a turn: call acquire() first")
        lease, now = self.lease, self.clock()
        self.longest_turn = max(self.longest_turn, now - self.turn_clock)
        if lease is not None and may_keep and self.keeps_turns and self._keepable(lease, now):
            self.kept = KeptLease(lease, self.asked, now, self.renew_at)
            self.lease, self.renew_at = None, None
            return Turn(lease, False, kept=True)
        revoked = self.revoked_id if lease is None else ""
        turn = Turn(lease, self.resuming, revoked=revoked)
        self.lease, self.resuming, self.renew_at = None, False, None
        return turn

    def _keepable(self, lease: LeaseInfo, now: float) -> bool:
        allowed, held = self.allowance, now - self.granted_clock
        if allowed.lease_id != lease.lease_id or held >= allowed.until_s:
            return False
        return held <= self._last_start(lease)

    def _last_start(self, lease: LeaseInfo) -> float:
        """Seconds from the grant within which a turn on the lease may start: what remains of
        the lease's maximum hold then is `TURN_MARGIN` times its longest turn."""
        return lease.hold_until - lease.granted_at - TURN_MARGIN * self.longest_turn

    def take_kept(self, gpus: Sequence[str] | None) -> LeaseInfo | None:
        """An acquire: the lease kept at the last yield, held again (the same `LeaseInfo`) if
        it may be taken back now: the same ask, within the window and what the agent allows."""
        kept, now = self.kept, self.clock()
        if kept is None or _ask(gpus) != kept.asked:
            return None
        if now - kept.since > self.allowance.window_s or not self._keepable(kept.lease, now):
            return None
        self.kept, self.lease, self.renew_at = None, kept.lease, kept.renew_at
        self.turn_clock = now
        return kept.lease

    def give_back(self) -> pb.Request | None:
        """The yield of the kept lease (or one not delivered before), to send now (None: none);
        its answer is nobody's (`unclaimed`)."""
        kept, self.kept = self.kept, None
        if kept is None:
            undelivered, self.undelivered = self.undelivered, None
            return undelivered
        release = self.release(kept.lease.lease_id)
        release.kept_s = max(0.0, self.clock() - kept.since)
        return pb.Request(request_id=next(self.ids), release=release)

    def kept_due(self) -> pb.Request | None:
        """The yield of the kept lease, if no acquire may take it back any more."""
        kept, now = self.kept, self.clock()
        if kept is None:
            return None
        if now - kept.since < self.allowance.window_s and self._keepable(kept.lease, now):
            return None
        return self.give_back()

    def kept_deadline(self) -> float | None:
        """When the kept lease is due to be given back, if one is kept."""
        kept, allowed = self.kept, self.allowance
        if kept is None:
            return None
        until = min(allowed.until_s, self._last_start(kept.lease))
        return min(kept.since + allowed.window_s, self.granted_clock + until)

    def yield_failed(self, turn: Turn) -> None:
        """The release never reached the agent: the turn is held again, so yield can be retried.

        Unless something else (a grant, a resume) changed the turn meanwhile.
        """
        if self.lease is not None or self.resuming:
            return
        self.lease, self.resuming = turn.lease, turn.resuming
        if turn.lease is not None:
            self.renew_at = self.clock() + self.renew_interval
            self.unsure = turn.lease.lease_id

    def ended_unheard(self, turn: Turn) -> bool:
        """The agent says the lease `turn` ends does not exist, and an earlier yield of it was cut
        off in flight: that yield ended it (its answer lost in the agent's restart)."""
        return bool(turn.lease_id) and turn.lease_id == self.unsure

    # What the agent sends unasked.

    def revoked(self, lease_id: str, reason: str = "", withdrawn: bool = False) -> None:
        """The agent took the turn back (held too long while others wait); it will return it.
        `withdrawn`, or named again while the turn waits to be given back: it never will be
        (`reason`), whether this client heard of the revocation or not."""
        resumed = self.resuming and self.lease is None and lease_id == self.revoked_id
        held = self.lease is not None and self.lease.lease_id == lease_id
        if resumed or (withdrawn and held):
            log.warning("%s; the next acquire() queues for a new turn", reason)
            self.lease, self.resuming, self.renew_at = None, False, None
            self.gone = True  # a yield_() now ends nothing, quietly
            return
        if self.lease is None or self.lease.lease_id != lease_id:
            log.info("turn %s revoked after this tenant yielded it", lease_id)
            return
        log.warning("turn revoked (%s); queued first for the next", reason)
        self.lease, self.resuming, self.renew_at = None, True, None
        self.revoked_id = lease_id

    def resumed(self, lease: LeaseInfo) -> None:
        """The agent gave a revoked turn back; not taken if the tenant yielded since."""
        if not self.resuming:
            log.info("turn %s given back after this tenant yielded; not taken", lease.lease_id)
            return
        self.granted(lease, self.asked)
        log.info("turn given back after a revocation: %s", lease.lease_id)

    def pushed(self, message: pb.AgentMessage) -> pb.Request | None:
        """A revocation, a resume, a hint or why an acquire waits, pushed on the session
        (anything else is the shell's); returns the yield of a kept lease to send now, if one
        is due."""
        kind = message.WhichOneof("kind")
        if kind == "revoked":
            kept = self.kept
            if kept is not None and kept.lease.lease_id == message.revoked.lease_id:
                return self.give_back()  # the yield cancels the resume the revocation queued
            revoked = message.revoked
            self.revoked(revoked.lease_id, revoked.reason, revoked.withdrawn)
        elif kind == "granted":
            self.resumed(LeaseInfo.from_pb(message.granted))
        elif kind == "park_at_yield":
            hint = message.park_at_yield
            self.yield_parks = (hint.lease_id, tuple(hint.gpus))
        elif kind == "keep_turn":
            self.allowance.CopyFrom(message.keep_turn)
            return self.kept_due()
        elif kind == "waiting":  # an acquire with no timeout learns why it waits
            waiting = message.waiting
            log.warning("the turn on [%s] waits: %s", ", ".join(waiting.gpus), waiting.reason)
        return None

    def parks_at_yield(self) -> tuple[str, ...]:
        """The GPUs to park before the held turn's yield leaves (the agent's latest word)."""
        lease_id, gpus = self.yield_parks
        held = self.lease is not None and self.lease.lease_id == lease_id
        return gpus if held and self.park_at_yield else ()

    def release(self, lease_id: str, parked: Mapping[str, int] | None = None) -> pb.YieldRequest:
        """The end of the turn `lease_id`, with the memory this process still holds parked
        (and what it `parked` as it yielded, GPU → bytes)."""
        request = pb.YieldRequest(lease_id=lease_id)  # maps filled only when not empty:
        for gpu, moved in self.parked().items():  # their constructor argument is slow
            if not parked or gpu not in parked:
                request.still_parked[gpu] = moved
        if parked:
            request.parked.update(parked)
        return request

    def unclaimed(self, reply: pb.Reply) -> pb.Request | None:
        """An answer no caller waits for (it gave up): a turn it grants is handed back."""
        if reply.HasField("lease"):
            return pb.Request(request_id=next(self.ids), release=self.release(reply.lease.lease_id))
        if reply.HasField("error"):
            log.debug("late answer %d: %s", reply.request_id, reply.error.message)
        else:
            log.debug("answer %d matches no request", reply.request_id)
        return None

    # Renewal and reclaim.

    def renewal_due(self) -> LeaseInfo | None:
        """The lease to renew now, if its time has come (none other is due until answered)."""
        if self.lease is None or self.renew_at is None or self.clock() < self.renew_at:
            return None
        self.renew_at = None
        return self.lease

    def reclaim(self) -> LeaseInfo | None:
        """After a reconnect: the lease to renew now, telling the new agent it is still in use
        (a kept one is yielded: `give_back`; the new agent says again what may be kept)."""
        self.allowance = pb.KeepTurn()
        if self.lease is not None:
            self.renew_at = None
        return self.lease

    def renewed(
        self, lease: LeaseInfo, outcome: LeaseInfo | BatonError, reclaiming: bool = False
    ) -> None:
        """A renewal of `lease` was answered (`outcome`: the renewed lease, or the error)."""
        if isinstance(outcome, TurnRevoked) and self.lease is lease:
            self.revoked(lease.lease_id, str(outcome))  # unheard: resumed all the same
            return
        if isinstance(outcome, LeaseLost):
            if self.lease is lease:
                self.lease, self.renew_at = None, None
                if lease.lease_id == self.unsure:  # the yield cut off in flight had ended it
                    log.info("turn %s ended by a yield whose answer was lost", lease.lease_id)
                    self.gone = True
                elif reclaiming:
                    log.warning(  # a restart, or its last session closing, ended the turn
                        "the turn %s did not outlive the reconnect: %s", lease.lease_id, outcome
                    )
                else:
                    log.warning("lease %s lost: %s", lease.lease_id, outcome)
            return
        if isinstance(outcome, BatonError):
            log.info("renewing lease %s failed: %s", lease.lease_id, outcome)
        if self.lease is None or self.lease.lease_id != lease.lease_id:
            if reclaiming:
                log.info("turn %s ended while it was being reclaimed", lease.lease_id)
            return
        if isinstance(outcome, LeaseInfo):
            self.lease = outcome
            if outcome.lease_id == self.unsure:  # the agent has it: the yield never arrived
                self.unsure = ""
            if reclaiming:
                log.warning("kept the turn %s across the reconnect", outcome.lease_id)
        self.renew_at = self.clock() + self.renew_interval

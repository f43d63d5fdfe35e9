"""The turns' clock: what follows each step that changed them, and the one timer.

After each burst of changes (one event-loop step) the clock sets the timer and names who is due
next: the residency layer hears of the tenant due next on a held GPU (`agent.core.ahead`), and
the holders hear what to park and what they may keep (`agent.server.yield_parks`,
`agent.server.kept_turns`). A single timer covers waiter deadlines and maximum hold times: a
waiter past its deadline expires, and a holder past its maximum (or ahead of a higher tier) is
revoked. `agent.server.turns.Turns` owns the clock and grants what it frees.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from agent.core import events as ev
from agent.core.ahead import LookAhead
from agent.core.leases import Lease, Waiter
from agent.server.kept_turns import KeptTurns
from agent.server.revocations import Revocations
from agent.server.turn_state import TurnState
from agent.server.waits import standings, timed_out
from agent.server.yield_parks import YieldParks
from baton._pb import agent_pb2 as pb

log = logging.getLogger(__name__)


class Granting(Protocol):
    """What the clock asks of the turns it drives (`agent.server.turns.Turns`)."""

    def expire(self, waiter: Waiter, error: Exception, why: str) -> None: ...

    def dispatch(self) -> None: ...

    def start_turns(self, waiters: list[Waiter]) -> None: ...

    def changed(self) -> None: ...


class TurnClock:
    """Settles the turns after each step and times out waiters and holders."""

    def __init__(self, state: TurnState, revocations: Revocations, turns: Granting) -> None:
        self._state = state
        self._turns = turns
        self.table = state.table
        self.revocations = revocations
        self.resumes = state.resumes
        self._timer: asyncio.TimerHandle | None = None
        self._ahead = LookAhead(state.preparer, state.spawn)
        self._yield_parks = YieldParks(state.parking, state.sessions)
        self._kept = KeptTurns(state.sessions)
        self._settle_pending = False
        self._closed = False

    def close(self) -> None:
        """Stop the timer: no more revocations or timeouts."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()

    def settle_soon(self) -> None:
        """After this burst of changes (one event-loop step): set the next timer and name who
        is due next. Once per step, however many grants and yields the step made."""
        if not self._settle_pending and not self._closed:
            self._settle_pending = True
            asyncio.get_running_loop().call_soon(self._settle)

    def _settle(self) -> None:
        self._settle_pending = False
        if self._closed:
            return
        self._reschedule()
        self.resumes.settle(self.table)
        self._state.journal_resumes()  # one that left the queue (quarantined, too large)
        self._ahead.look(self.table)
        self._yield_parks.look(self.table)
        self._kept.look(self.table)

    def _reschedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        now = self._state.clock()
        deadline = self.table.next_deadline(after=now)
        due = [w.deadline for w in self.table.waiters.values() if not w.reserved]
        soonest = min((d for d in due if d is not None), default=None)
        overdue = any(
            (at := self.table.revoke_at(lease)) is not None
            and at <= now
            and self.revocations.may_start(lease.lease_id, now)
            for lease in self.table.leases.values()
        )  # a lease can run out before anyone waits; the first waiter makes it overdue at once
        if overdue or (soonest is not None and soonest <= now):
            deadline = now
        leases = self.table.leases
        deadline = self.revocations.sooner(
            deadline, now, leases.keys(), lambda k: self.table.revoke_at(leases[k]) is not None
        )
        if deadline is not None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(max(0.0, deadline - now), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        now = self._state.clock()
        metrics = self._state.metrics
        why = standings(self.table, metrics, now, due=now)  # before they leave the queue
        tick = self.table.tick()
        for waiter in tick.expired:
            reason = why.get(waiter.waiter_id) or waiter.blocked
            self._turns.expire(waiter, timed_out(waiter, reason), reason)
        for lease in tick.overdue:
            if self.revocations.may_start(lease.lease_id, self._state.clock()):
                self.revocations.start(lease.lease_id)
                self._state.spawn(self._revoke(lease))
        if self.revocations.moves_due(now, self.table) or tick.expired or tick.unheld:
            self._turns.dispatch()
        self._reschedule()  # now: this timer is spent

    async def _revoke(self, lease: Lease) -> None:
        waiting = len({w.tenant_id for g in lease.gpus for w in self.table.queue_of(g)})
        overdue = lease.hold_until <= self._state.clock()
        why = "held past maximum" if overdue else "a higher tier waits"
        log.warning(
            "tenant %s held [%s] (%s, maximum %g s) while %d others wait; revoking",
            lease.tenant_id, ", ".join(lease.gpus), why, self.table.max_hold, waiting,
        )  # fmt: skip

        def holds() -> bool:
            return lease.lease_id in self.table.leases

        def waited() -> bool:  # someone still waits for its GPUs
            return holds() and self.table.revoke_at(lease) is not None

        try:
            parked = await self._state.preparer.revoke(lease.tenant_id, lease.gpus, holds, waited)
        except Exception as exc:  # the holder keeps the GPU until it can be parked
            if lease.lease_id in self.table.leases:
                why = self.revocations.failed(self.table, lease, exc, self._state.clock())
                self._state.publish(ev.REVOKE_FAILED, lease.tenant_id, lease=lease, detail=why)
                self._reschedule()
            return
        finally:
            self.revocations.finished(lease.lease_id)
        if lease.lease_id not in self.table.leases:  # yielded meanwhile
            return
        if not parked:  # its waiters left before it was parked: it keeps its turn
            self._reschedule()
            return
        _, due, resume = self.table.revoke(lease.lease_id)
        self._state.journal_end(lease)  # written with the grant it makes room for
        self.resumes.revoked(lease, resume, self.table)
        self._state.metrics.released(lease, self._state.clock(), revoked=True)
        self._state.publish(ev.REVOKED, lease.tenant_id, lease=lease, detail=why)
        reason = "held past the maximum hold time" if overdue else "a higher tier waits"
        revoked = pb.Revoked(lease_id=lease.lease_id, reason=reason)
        self._state.sessions.notify(lease.tenant_id, pb.AgentMessage(revoked=revoked))
        # After the revocation is told: a grant made from the agent's model happens inside
        # start_turns, and its event must not come before the end of the turn it follows.
        self._turns.start_turns(due)
        self._turns.changed()

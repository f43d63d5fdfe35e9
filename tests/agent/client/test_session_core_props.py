"""The session core against a model agent, under any order of grants, pushes, yields, renewals.

The model agent delivers its pushes (revocations, resumes) late, as a slow session would, so
every crossing with a yield or a renewal is tried; once nothing is in flight the agent must
count no turn for this tenant that the client does not know it holds.
"""

from __future__ import annotations

import itertools

from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from agent.client.errors import AgentUnavailable, BatonError, LeaseLost
from agent.client.session_core import SessionCore
from agent.client.types import LeaseInfo
from baton._pb import agent_pb2 as pb

INTERVAL = 1.0
GPUS = ("GPU-0", "GPU-1")


class SessionCoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.core = SessionCore(INTERVAL, lambda: self.now)
        self.ids = itertools.count(1)
        self.live: set[str] = set()
        """The leases the agent counts as this tenant's."""
        self.queued_resume = False
        """The agent revoked this tenant's turn and owes it the next."""
        self.dropped: set[str] = set()
        """Leases the agent dropped without a word (the client learns it by renewing)."""
        self.inbox: list[pb.AgentMessage] = []
        """Pushes on their way to the client."""
        self.renewals: list[tuple[LeaseInfo, bool]] = []
        """Renewals on their way to the agent (lease, reclaiming)."""

    def _lease(self) -> LeaseInfo:
        lease_id = f"l{next(self.ids)}"
        self.live.add(lease_id)
        return LeaseInfo(lease_id, GPUS, dict.fromkeys(GPUS, 1), self.now, self.now + 5, False)

    def _agent_idle(self) -> bool:
        return not self.live and not self.queued_resume

    def _release(self) -> None:
        """A release ends the tenant's turn, whichever lease id (or none, while resuming)."""
        self.live.clear()
        self.queued_resume = False

    # The caller.

    @precondition(lambda self: not self.core.holding() and self._agent_idle())
    @rule()
    def acquire(self) -> None:
        granted = self._lease()
        assert self.core.granted(granted) is granted
        assert self.core.renew_at == self.now + INTERVAL

    @precondition(lambda self: self.core.holding())
    @rule()
    def yield_(self) -> None:
        ended = self.core.begin_yield()
        assert not self.core.holding() and self.core.renew_at is None
        assert ended.lease_id == "" or ended.lease is not None
        self._release()

    @precondition(lambda self: self.core.holding())
    @rule()
    def yield_that_never_arrives(self) -> None:
        before = (self.core.lease, self.core.resuming)
        ended = self.core.begin_yield()
        self.core.yield_failed(ended)
        assert (self.core.lease, self.core.resuming) == before, "rolled back to held"
        if self.core.lease is not None:
            assert self.core.renew_at is not None

    @precondition(lambda self: self._agent_idle())
    @rule()
    def late_grant(self) -> None:
        """A grant to an acquire the caller gave up on: handed back, and nothing else changes."""
        granted = self._lease()
        before = (self.core.lease, self.core.resuming, self.core.renew_at)
        reply = pb.Reply(request_id=10_000, lease=pb.Lease(lease_id=granted.lease_id))
        release = self.core.unclaimed(reply)
        assert release is not None and release.release.lease_id == granted.lease_id
        assert (self.core.lease, self.core.resuming, self.core.renew_at) == before
        self.live.discard(release.release.lease_id)

    # The agent.

    @precondition(lambda self: len(self.live) == 1)
    @rule()
    def revoke(self) -> None:
        (lease_id,) = self.live
        self.live.clear()
        self.queued_resume = True
        self.inbox.append(pb.AgentMessage(revoked=pb.Revoked(lease_id=lease_id, reason="hold")))

    @precondition(lambda self: self.queued_resume and not self.live)
    @rule()
    def resume(self) -> None:
        self.queued_resume = False
        given = self._lease()
        self.inbox.append(pb.AgentMessage(granted=pb.Lease(lease_id=given.lease_id, gpus=GPUS)))

    @precondition(lambda self: self.live)
    @rule()
    def agent_drops_the_lease(self) -> None:
        self.dropped |= self.live
        self.live.clear()

    @precondition(lambda self: self.inbox)
    @rule()
    def deliver(self) -> None:
        self.core.pushed(self.inbox.pop(0))

    # Renewal and reconnects.

    @rule()
    def time_passes(self) -> None:
        self.now += INTERVAL
        lease = self.core.renewal_due()
        if lease is not None:
            self.renewals.append((lease, False))

    @rule()
    def reconnect(self) -> None:
        lease = self.core.reclaim()
        if lease is not None:
            self.renewals.append((lease, True))

    @precondition(lambda self: self.renewals and not self.inbox)
    @rule()
    def renewal_answered(self) -> None:
        """Answered on the session, so after the pushes sent before it."""
        lease, reclaiming = self.renewals.pop(0)
        outcome: LeaseInfo | BatonError = (
            lease if lease.lease_id in self.live else LeaseLost(f"{lease.lease_id} is gone")
        )
        self.core.renewed(lease, outcome, reclaiming)

    @precondition(lambda self: self.renewals)
    @rule()
    def renewal_fails(self) -> None:
        lease, reclaiming = self.renewals.pop(0)
        self.core.renewed(lease, AgentUnavailable("restarting"), reclaiming)

    # What always holds.

    @invariant()
    def one_turn_at_most(self) -> None:
        assert not (self.core.lease is not None and self.core.resuming)
        assert len(self.live) <= 1, "at most one lease per GPU for this tenant"
        if self.core.lease is None:
            assert self.core.renew_at is None

    @invariant()
    def a_held_lease_is_always_renewed(self) -> None:
        lease = self.core.lease
        if lease is not None and self.core.renew_at is None:
            assert any(r.lease_id == lease.lease_id for r, _ in self.renewals)

    @invariant()
    def the_agent_counts_no_turn_the_client_does_not_know(self) -> None:
        if self.inbox or self.renewals:
            return
        held = {self.core.lease.lease_id} if self.core.lease is not None else set()
        assert self.live <= held
        assert held <= self.live | self.dropped, "the client holds no turn the agent ended"
        if self.queued_resume:
            assert self.core.resuming


TestSessionCoreMachine = SessionCoreMachine.TestCase
TestSessionCoreMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)

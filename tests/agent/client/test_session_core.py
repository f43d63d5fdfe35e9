"""The client's session state machine alone: tables of cases, no sockets, a clock of our own."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.client.errors import AgentUnavailable, LeaseLost, NotHolding
from agent.client.session_core import SessionCore, acquire_request
from agent.client.types import LeaseInfo
from baton._pb import agent_pb2 as pb

INTERVAL = 2.0
_ids = itertools.count(1)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lease(lease_id: str | None = None) -> LeaseInfo:
    return LeaseInfo(lease_id or f"l{next(_ids)}", ("GPU-0",), {"GPU-0": 1}, 0.0, 60.0, False)


def core() -> tuple[SessionCore, Clock]:
    clock = Clock()
    return SessionCore(INTERVAL, clock), clock


def revoked(lease_id: str) -> pb.AgentMessage:
    return pb.AgentMessage(revoked=pb.Revoked(lease_id=lease_id, reason="max hold"))


def resumed(given: LeaseInfo) -> pb.AgentMessage:
    return pb.AgentMessage(granted=pb.Lease(lease_id=given.lease_id, gpus=list(given.gpus)))


def in_state(state: str) -> SessionCore:
    """A core idle, holding a turn, or waiting for a revoked turn to come back."""
    session, _ = core()
    if state in ("held", "resuming"):
        session.granted(lease("held"))
    if state == "resuming":
        session.pushed(revoked("held"))
    return session


STATES = ("idle", "held", "resuming")


def test_a_grant_holds_the_turn_and_schedules_its_renewal() -> None:
    session, clock = core()
    session.granted(lease("a"))
    assert session.lease is not None and session.lease.lease_id == "a"
    assert session.renew_at == clock.now + INTERVAL
    assert session.renewal_due() is None  # not yet
    clock.now += INTERVAL
    assert session.renewal_due() == lease("a")
    assert session.renewal_due() is None, "one renewal at a time, until it is answered"


@pytest.mark.parametrize("state", STATES)
@given(lease_id=st.text(min_size=1, max_size=8))
def test_a_late_grant_is_always_handed_back_and_changes_nothing(state: str, lease_id: str) -> None:
    session = in_state(state)
    before = (session.lease, session.resuming, session.renew_at)
    release = session.unclaimed(pb.Reply(request_id=99, lease=pb.Lease(lease_id=lease_id)))
    assert release is not None and release.release.lease_id == lease_id
    assert release.request_id != 99, "the hand-back is a request of its own"
    assert (session.lease, session.resuming, session.renew_at) == before


def test_every_end_of_a_turn_says_what_the_process_still_holds_parked() -> None:
    session = SessionCore(INTERVAL)
    assert dict(session.release("a").still_parked) == {}
    session.parked = lambda: {"GPU-0": 60 << 20}  # a grant's restore that never ran
    assert dict(session.release("a").still_parked) == {"GPU-0": 60 << 20}
    late = session.unclaimed(pb.Reply(request_id=9, lease=pb.Lease(lease_id="b")))
    assert late is not None and dict(late.release.still_parked) == {"GPU-0": 60 << 20}


def hint(lease_id: str, *gpus: str) -> pb.AgentMessage:
    return pb.AgentMessage(park_at_yield=pb.ParkAtYield(lease_id=lease_id, gpus=gpus))


def test_a_park_at_yield_is_the_latest_word_on_the_turn_held() -> None:
    session, _ = core()
    session.pushed(hint("a", "GPU-0"))  # before the grant it names reached the caller
    session.granted(lease("a"))
    assert session.parks_at_yield() == ("GPU-0",)
    session.pushed(hint("a"))  # withdrawn: nobody due next needs the room any more
    assert session.parks_at_yield() == ()
    session.pushed(hint("old", "GPU-0"))  # a turn that ended
    assert session.parks_at_yield() == ()
    session.pushed(hint("a", "GPU-0"))
    session.park_at_yield = False  # the client leaves every park to the agent's callbacks
    assert session.parks_at_yield() == ()
    session.park_at_yield = True
    session.begin_yield()
    assert session.parks_at_yield() == ()  # no turn held


def test_the_end_of_a_turn_names_what_it_parked_apart_from_what_stayed_parked() -> None:
    session, _ = core()
    session.parked = lambda: {"GPU-0": 7, "GPU-1": 9}  # both parked in this process now
    request = session.release("a", parked={"GPU-1": 9})  # GPU-1 parked as this turn ended
    assert dict(request.parked) == {"GPU-1": 9} and dict(request.still_parked) == {"GPU-0": 7}
    assert not session.release("a").parked


def test_a_late_error_or_empty_answer_is_dropped() -> None:
    session = in_state("idle")
    late = pb.Reply(request_id=3, error=pb.ErrorStatus(code=4, message="deadline"))
    assert session.unclaimed(late) is None
    assert session.unclaimed(pb.Reply(request_id=4)) is None


@pytest.mark.parametrize("state", ["held", "resuming"])
def test_a_failed_yield_rolls_back_to_the_turn_it_ended(state: str) -> None:
    session = in_state(state)
    before = (session.lease, session.resuming)
    ended = session.begin_yield()
    assert session.lease is None and not session.resuming and session.renew_at is None
    assert ended.lease_id == ("held" if state == "held" else "")
    session.yield_failed(ended)
    assert (session.lease, session.resuming) == before
    assert (session.renew_at is not None) == (state == "held")


def test_a_failed_yield_does_not_undo_a_turn_taken_since() -> None:
    session = in_state("held")
    ended = session.begin_yield()
    session.granted(lease("next"))  # another thread's acquire, answered while the yield failed
    session.yield_failed(ended)
    assert session.lease is not None and session.lease.lease_id == "next"


def test_yield_without_a_turn_is_refused() -> None:
    session = in_state("idle")
    with pytest.raises(NotHolding):
        session.begin_yield()


def test_revocation_then_resume_restores_the_turn() -> None:
    session, clock = core()
    session.granted(lease("a"))
    session.pushed(revoked("a"))
    assert session.lease is None and session.resuming and session.renew_at is None
    clock.now += 50
    session.pushed(resumed(lease("b")))
    assert session.lease is not None and session.lease.lease_id == "b"
    assert not session.resuming and session.renew_at == clock.now + INTERVAL


@pytest.mark.parametrize(
    ("first", "then", "held", "resuming"),
    [
        ("revoke-other", None, "a", False),  # a turn yielded before: not this one
        ("yield", "resume", None, False),  # the turn given back after a yield is not taken
        ("revoke", "yield-resume", None, False),  # yielding while resuming ends the turn
    ],
)
def test_crossings_of_pushes_and_yields(
    first: str, then: str | None, held: str | None, resuming: bool
) -> None:
    session, _ = core()
    session.granted(lease("a"))
    for step in (first, then):
        if step == "revoke-other":
            session.pushed(revoked("old"))
        elif step == "revoke":
            session.pushed(revoked("a"))
        elif step == "yield":
            session.begin_yield()
        elif step == "resume":
            session.pushed(resumed(lease("b")))
        elif step == "yield-resume":
            assert session.begin_yield().lease_id == ""
            session.pushed(resumed(lease("b")))
    assert (session.lease.lease_id if session.lease else None) == held
    assert session.resuming == resuming


def test_renewal_answers() -> None:
    session, clock = core()
    first = session.granted(lease("a"))
    clock.now += INTERVAL
    assert session.renewal_due() is first
    renewed = LeaseInfo("a", ("GPU-0",), {"GPU-0": 1}, 0.0, 9.0, True)
    session.renewed(first, renewed)
    assert session.lease is renewed and session.renew_at == clock.now + INTERVAL
    clock.now += INTERVAL
    assert session.renewal_due() is renewed
    session.renewed(renewed, AgentUnavailable("restarting"))  # kept; tried again later
    assert session.lease is renewed and session.renew_at == clock.now + INTERVAL
    session.renewed(renewed, LeaseLost("gone"))
    assert session.lease is None and session.renew_at is None


def test_a_renewal_answered_after_the_turn_ended_changes_nothing() -> None:
    session, clock = core()
    first = session.granted(lease("a"))
    clock.now += INTERVAL
    session.renewal_due()
    session.begin_yield()
    second = session.granted(lease("b"))
    session.renewed(first, LeaseLost("gone"))
    session.renewed(first, first)
    assert session.lease is second and session.renew_at == clock.now + INTERVAL


@pytest.mark.parametrize("answer", ["kept", "lost", "yielded-meanwhile"])
def test_reclaim_after_a_reconnect(answer: str, caplog: pytest.LogCaptureFixture) -> None:
    session, _ = core()
    assert session.reclaim() is None  # nothing held: nothing to reclaim
    held = session.granted(lease("a"))
    assert session.reclaim() is held and session.renew_at is None
    if answer == "kept":
        session.renewed(held, held, reclaiming=True)
        assert session.lease is held and session.renew_at is not None
    elif answer == "lost":
        session.renewed(held, LeaseLost("dropped in the restart"), reclaiming=True)
        assert session.lease is None and session.renew_at is None
        assert "did not outlive the reconnect: dropped in the restart" in caplog.text  # why
    else:
        session.begin_yield()
        session.renewed(held, held, reclaiming=True)
        assert session.lease is None and session.renew_at is None


def test_request_ids_are_shared_and_increase() -> None:
    session = in_state("idle")
    first = next(session.ids)
    release = session.unclaimed(pb.Reply(request_id=1, lease=pb.Lease(lease_id="x")))
    assert release is not None and release.request_id == first + 1


@pytest.mark.parametrize(
    ("timeout", "gpus", "timeout_ms", "asked"),
    [(None, None, 0, []), (0.0001, ["GPU-1"], 1, ["GPU-1"]), (2.5, (), 2500, [])],
)
def test_the_acquire_sent_for_a_timeout(
    timeout: float | None, gpus: list[str] | None, timeout_ms: int, asked: list[str]
) -> None:
    request = acquire_request(timeout, gpus)
    assert request.acquire.timeout_ms == timeout_ms and list(request.acquire.gpus) == asked


@pytest.mark.parametrize("order", ["reclaimed-first", "yielded-first"])
def test_a_yield_cut_off_by_a_restart_that_reached_the_agent_ends_the_turn_quietly(
    order: str,
) -> None:
    """The yield reached the old agent (the turn ended there), its answer was lost as the agent
    restarted; the tenant makes the yield again, as it should after AgentUnavailable."""
    session, _ = core()
    held = session.granted(lease("a"))
    ended = session.begin_yield()
    session.yield_failed(ended)  # the client cannot tell: it holds the turn again
    assert session.lease is held
    if order == "reclaimed-first":  # the new agent has no such lease
        assert session.reclaim() is held
        session.renewed(held, LeaseLost("no lease a"), reclaiming=True)
        again = session.begin_yield()
        assert again.gone and again.lease is None  # nothing to send, nothing raised
        with pytest.raises(NotHolding):  # once: the next yield is the caller's mistake again
            session.begin_yield()
    else:  # the yield made again reaches the new agent before the reclaim's answer
        again = session.begin_yield()
        assert not again.gone and again.lease_id == "a"
        assert session.ended_unheard(again)  # its "no such lease" means the turn had ended


@pytest.mark.parametrize("there", [True, False])
def test_an_acquire_returns_a_turn_whose_yield_was_cut_off_only_once_the_agent_says_so(
    there: bool,
) -> None:
    """`there`: whether the agent, asked again, still has the lease (the yield never arrived)."""
    session, _ = core()
    held = session.granted(lease("a"))
    session.yield_failed(session.begin_yield())
    assert session.held(None) is None and session.unsure_held() is held  # not from memory
    outcome = lease("a") if there else LeaseLost("no lease a")
    session.renewed(held, outcome, reclaiming=True)
    assert session.unsure_held() is None
    assert session.held(None) is (outcome if there else None)


def test_a_lease_lost_without_a_yield_cut_off_is_still_said() -> None:
    session, _ = core()
    held = session.granted(lease("a"))
    session.reclaim()
    session.renewed(held, LeaseLost("dropped in the restart"), reclaiming=True)
    with pytest.raises(NotHolding):
        session.begin_yield()
    other = session.granted(lease("b"))
    assert not session.ended_unheard(session.begin_yield())  # never cut off: a real loss
    assert other.lease_id == "b"

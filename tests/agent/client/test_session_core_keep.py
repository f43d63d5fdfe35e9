"""Kept turns in the client's state machine: a yield keeps the lease when the agent says it may,
the next acquire takes it back within the window, and anything else yields it to the agent."""

from __future__ import annotations

import pytest

from agent.client.session_core import SessionCore
from baton._pb import agent_pb2 as pb
from tests.agent.client.test_session_core import Clock, core, lease, revoked

WINDOW = 0.01
AWAY = {"past the window": 2 * WINDOW, "past what the agent allows": 0.007}
"""How long after its yield the caller asks again, by case."""


def keep(lease_id: str, until: float) -> pb.AgentMessage:
    return pb.AgentMessage(keep_turn=pb.KeepTurn(lease_id=lease_id, until_s=until, window_s=WINDOW))


def kept_session(until: float = 1.0) -> tuple[SessionCore, Clock]:
    """A core holding "held" that the agent lets keep it `until` s after its grant."""
    session, clock = core()
    session.granted(lease("held"))
    assert session.pushed(keep("held", until)) is None
    return session, clock


def test_a_yield_keeps_the_lease_and_the_next_acquire_takes_it_back() -> None:
    session, clock = kept_session()
    renew_at = session.renew_at
    turn = session.begin_yield()
    assert turn.kept and session.lease is None and not session.holding()
    clock.now += WINDOW / 2
    again = session.take_kept(None)
    assert again is not None and again.lease_id == "held"
    assert session.lease is again and session.renew_at == renew_at  # the same renewal
    assert session.kept is None


@pytest.mark.parametrize(
    "case", ["past the window", "past what the agent allows", "another ask", "parked at its yield"]
)
def test_a_kept_lease_not_taken_back_is_yielded_to_the_agent(case: str) -> None:
    session, clock = kept_session(until=0.5)
    if case == "past what the agent allows":
        clock.now += 0.495  # it yields 5 ms before the allowance ends...
    turn = session.begin_yield(may_keep=case != "parked at its yield")
    if case == "parked at its yield":  # it parked as it yielded: the yield goes out
        assert not turn.kept and session.kept is None
        return
    assert turn.kept
    clock.now += AWAY.get(case, 0.0)
    gpus = ["GPU-0"] if case == "another ask" else None  # the lease was asked for all
    assert session.take_kept(gpus) is None  # ...and asks again 7 ms later, within the window
    release = session.give_back()
    assert release is not None and release.release.lease_id == "held"
    assert release.release.kept_s == pytest.approx(AWAY.get(case, 0.0))  # since the yield
    assert session.give_back() is None  # once


def test_only_the_same_ask_takes_a_kept_lease_back() -> None:
    session, _ = core()
    session.granted(lease("held"), ["GPU-0"])
    session.pushed(keep("held", 1.0))
    session.begin_yield()
    assert session.take_kept(None) is None  # all the tenant's GPUs: maybe more than GPU-0
    assert session.take_kept(["GPU-0"]) is not None


def test_a_yield_that_could_not_be_sent_goes_out_with_the_next_give_back() -> None:
    session, _ = kept_session()
    session.begin_yield()
    release = session.give_back()
    assert release is not None
    session.undelivered = release  # the session was down: the shell keeps it
    assert session.give_back() is release  # after the reconnect
    assert session.give_back() is None


def test_the_keepers_deadline_and_its_verdict() -> None:
    session, clock = kept_session(until=1.0)
    assert session.kept_deadline() is None and session.kept_due() is None
    session.begin_yield()
    assert session.kept_deadline() == pytest.approx(clock.now + WINDOW)
    session.pushed(keep("held", 0.005))  # the allowance now ends before the window
    assert session.kept_deadline() == pytest.approx(clock.now + 0.005)
    session.pushed(keep("held", 1.0))
    assert session.kept_due() is None  # the caller may still come back
    clock.now += WINDOW
    release = session.kept_due()
    assert release is not None and release.release.lease_id == "held"
    assert session.kept is None and session.take_kept(None) is None


def test_the_agent_withdrawing_the_keep_yields_a_kept_lease_at_once() -> None:
    session, _ = kept_session()
    session.begin_yield()
    assert session.pushed(keep("other", 5.0)) is not None  # says nothing more of this lease
    session, _ = kept_session()
    session.begin_yield()
    release = session.pushed(keep("held", 0.0))
    assert release is not None and release.release.lease_id == "held"


def test_a_revocation_of_a_kept_lease_yields_it_and_waits_for_no_resume() -> None:
    session, _ = kept_session()
    session.begin_yield()
    release = session.pushed(revoked("held"))
    assert release is not None and release.release.lease_id == "held"
    assert not session.resuming  # the yield cancels the resume the agent queued


def test_without_the_agents_word_or_for_another_lease_a_yield_goes_out() -> None:
    session, _ = core()
    session.granted(lease("held"))
    assert not session.begin_yield().kept  # nothing said
    session, _ = kept_session()
    session.begin_yield()
    session.take_kept(None)
    session.pushed(keep("held", 0.0))
    assert not session.begin_yield().kept  # withdrawn while held
    session, _ = kept_session()
    session.granted(lease("new"))  # a new lease: what was said of the old one does not carry
    assert not session.begin_yield().kept


def test_a_reconnect_forgets_what_may_be_kept() -> None:
    session, _ = kept_session()
    session.begin_yield()
    assert session.reclaim() is None
    assert session.give_back() is not None
    session.granted(lease("held"))
    assert not session.begin_yield().kept


def test_a_turn_is_not_taken_back_when_it_could_outrun_the_maximum_hold() -> None:
    """The agent counts the kept turns as one lease, with one maximum hold (60 s here): a turn
    starts on it only while what remains is twice its longest turn; else it is asked for."""
    session, clock = kept_session(until=60.0)  # owed the whole maximum hold
    clock.now += 10.0  # a turn of 10 s: 50 s remain
    assert session.begin_yield().kept
    assert session.kept_deadline() == pytest.approx(clock.now + WINDOW)  # the window's
    assert session.take_kept(None) is not None
    clock.now += 25.0  # a turn of 25 s: 25 s remain, too few for another as long
    turn = session.begin_yield()
    assert not turn.kept and turn.lease_id == "held" and session.kept is None

"""The invariant checker catches each broken promise it is meant to catch."""

from __future__ import annotations

from agent.core.waitbound import WaitBound

from .checker import InvariantChecker, jain

G = "GPU-0"


def granted(c: InvariantChecker, at: float, tenant: str, lease: str, token: int) -> None:
    c.event("queued", tenant, at - 0.01, gpus=[G])
    c.event("granted", tenant, at, gpus=[G], lease_id=lease, tokens={G: token})


def test_a_clean_run_has_no_violations_and_counts_handoffs():
    c = InvariantChecker()
    granted(c, 1.0, "a", "l1", 1)
    c.event("yielded", "a", 1.5, gpus=[G], lease_id="l1")
    c.move("park", "a", G, 1.55, 1.6)
    granted(c, 1.7, "b", "l2", 2)
    c.event("yielded", "b", 2.0, gpus=[G], lease_id="l2")
    c.move("restore", "a", G, 2.05, 2.1)
    granted(c, 2.2, "a", "l3", 3)
    report = c.check(max_wait=1.0)
    assert report.violations == []
    assert (report.grants, report.handoffs, report.parks, report.restores) == (3, 2, 1, 1)
    assert report.turns == {"a": 2, "b": 1}


def test_two_holders_an_old_token_a_missing_restore_and_a_long_wait_are_caught():
    c = InvariantChecker()
    granted(c, 1.0, "a", "l1", 5)
    c.move("park", "b", G, 0.5, 0.6)
    c.event("queued", "b", 1.05, gpus=[G])
    c.event("granted", "b", 3.0, gpus=[G], lease_id="l2", tokens={G: 4})
    violations = " | ".join(c.check(max_wait=1.0).violations)
    assert "while a holds it" in violations
    assert "while parked" in violations
    assert "fencing token 4 on GPU-0 after 5" in violations
    assert "waited 1.95 s" in violations


def test_parking_a_holder_is_a_violation_unless_it_is_revoked():
    c = InvariantChecker()
    granted(c, 1.0, "a", "l1", 1)
    c.move("park", "a", G, 1.1, 1.2)
    c.event("yielded", "a", 1.3, gpus=[G], lease_id="l1")
    assert any("parks of a holder" in v for v in c.check(max_wait=9).violations)
    c = InvariantChecker()
    granted(c, 1.0, "a", "l1", 1)
    c.move("park", "a", G, 1.1, 1.2)
    c.event("revoked", "a", 1.3, gpus=[G], lease_id="l1")
    assert c.check(max_wait=9).violations == []


def test_jain_index():
    assert jain([5, 5, 5, 5]) == 1.0
    assert jain([1, 0, 0, 0]) == 0.25


def turn(c: InvariantChecker, tenant: str, start: float, end: float, token: int) -> None:
    """A whole turn of `tenant` on G (queued 10 ms before its grant), ended by a yield."""
    granted(c, start, tenant, f"l{token}", token)
    c.event("yielded", tenant, end, gpus=[G], lease_id=f"l{token}")


BOUND = WaitBound(max_hold=1.0, handover=0.5)


def test_a_waiter_is_held_to_the_bound_of_the_turns_ahead_of_it():
    c = InvariantChecker()
    c.event("queued", "w", 0.0, gpus=[G])
    turn(c, "a", 0.1, 1.0, 1)
    turn(c, "b", 1.1, 2.0, 2)
    c.event("granted", "w", 2.2, gpus=[G], lease_id="l3", tokens={G: 3})
    assert c.check(bound=BOUND).violations == []
    c = InvariantChecker()
    c.event("queued", "w", 0.0, gpus=[G])
    turn(c, "a", 0.1, 1.0, 1)
    c.event("granted", "w", 2.2, gpus=[G], lease_id="l2", tokens={G: 2})  # slack: 1 x 1.5 + 0.5
    assert (
        "waited 2.20 s behind 1 turns (the bound allows 2.00 s)"
        in c.check(bound=BOUND).violations[0]
    )


def test_a_skipped_waiter_is_caught_and_a_revoked_holders_resumed_turn_is_not():
    c = InvariantChecker()
    c.event("queued", "w", 0.0, gpus=[G])
    turn(c, "a", 0.1, 0.2, 1)
    turn(c, "b", 0.3, 0.4, 2)
    turn(c, "a", 0.5, 0.6, 3)  # a again, while w still waits: w was skipped
    c.event("granted", "w", 0.7, gpus=[G], lease_id="l4", tokens={G: 4})
    violations = c.check(bound=BOUND).violations
    assert violations == [
        "0.700: w waited behind 3 turns on GPU-0; the policy allows 2 "
        "(2 tenants share them, 0 revoked holders resumed)"
    ]
    c = InvariantChecker()
    c.event("queued", "w", 0.0, gpus=[G])
    granted(c, 0.1, "a", "l1", 1)
    c.move("park", "a", G, 1.15, 1.2)
    c.event("revoked", "a", 1.2, gpus=[G], lease_id="l1")
    turn(c, "b", 1.3, 1.4, 2)
    c.move("restore", "a", G, 1.4, 1.45)
    c.event("granted", "a", 1.5, gpus=[G], lease_id="l3", tokens={G: 3})  # handed back
    c.event("yielded", "a", 1.6, gpus=[G], lease_id="l3")
    c.event("granted", "w", 1.7, gpus=[G], lease_id="l4", tokens={G: 4})
    assert c.check(bound=BOUND).violations == []


def test_a_holder_kept_past_its_maximum_while_others_wait_is_caught():
    c = InvariantChecker()
    granted(c, 0.0, "a", "l1", 1)
    c.event("queued", "w", 0.5, gpus=[G])
    c.event("yielded", "a", 1.6, gpus=[G], lease_id="l1")  # the maximum ran out at 1.0
    c.event("granted", "w", 1.7, gpus=[G], lease_id="l2", tokens={G: 2})
    assert c.check(bound=BOUND).violations == [
        "1.600: a held GPU-0 1.60 s while others waited, 0.10 s past its maximum hold and a "
        "handover"
    ]
    c = InvariantChecker()
    granted(c, 0.0, "a", "l1", 1)
    c.event("queued", "w", 5.0, gpus=[G])  # its maximum ran out unwatched: revoked from here
    c.event("yielded", "a", 5.4, gpus=[G], lease_id="l1")
    c.event("granted", "w", 5.5, gpus=[G], lease_id="l2", tokens={G: 2})
    assert c.check(bound=BOUND).violations == []

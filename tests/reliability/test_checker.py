"""The invariant checker catches each broken promise it is meant to catch."""

from __future__ import annotations

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

"""What a holder may keep across its yields (`KeepTurn`): exactly as long as its yield would be
granted straight back, a whole window more included, before everyone waiting."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.fair import FairConfig, FairShare
from agent.core.leases import LeaseTable
from agent.core.waiters import TenantUsage, Waiter
from tests.agent.core.test_anticipation import Node


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 100),
    st.integers(1, 100),
    st.floats(0.0, 5.0),
    st.floats(0.0, 5.0),
    st.floats(0.0, 20.0),
    st.floats(0.0, 1.0),
)
def test_keep_s_is_where_ahead_of_changes(
    mine: int, theirs: int, v_mine: float, v_theirs: float, clock: float, frac: float
) -> None:
    fair = FairShare(FairConfig(credit_s=10.0))
    fair.vtime = {"h": v_mine, "w": v_theirs}
    fair.vclock = {"g": clock}
    usage = {"h": TenantUsage(duty=mine), "w": TenantUsage(duty=theirs)}
    waiter = Waiter("w1", "w", ("g",), seq=3, enqueued_at=0.0)
    keep = fair.keep_s("h", ("g",), waiter, usage)
    assert keep >= 0.0
    if keep > 1e-6:  # below it, asking again would still come first
        assert fair.ahead_of("h", ("g",), waiter, usage, extra_s=keep * frac * (1 - 1e-6))
    assert not fair.ahead_of("h", ("g",), waiter, usage, extra_s=keep * (1 + 1e-6) + 1e-9)


def test_keep_s_is_zero_across_tiers_and_for_owed_or_revoked_waiters() -> None:
    fair = FairShare(FairConfig())
    fair.vtime = {"h": 0.0, "w": 5.0}
    usage = {"h": TenantUsage(duty=50, tier=1), "w": TenantUsage(duty=50)}
    waiter = Waiter("w1", "w", ("g",), seq=1, enqueued_at=0.0)
    assert fair.keep_s("h", ("g",), waiter, usage) == 0.0  # tiers: balances move at turn ends
    usage["h"] = TenantUsage(duty=50)
    assert fair.keep_s("h", ("g",), waiter, usage) == pytest.approx(2.5)
    front = Waiter("w2", "w", ("g",), seq=1, enqueued_at=0.0, front=True)
    assert fair.keep_s("h", ("g",), front, usage) == 0.0  # a revoked holder goes first
    fair.balance[("g", 0)] = 1.0
    assert fair.keep_s("h", ("g",), waiter, usage) == 0.0  # owed a minimum share


def test_keep_for_counts_the_window_and_the_nearest_waiter() -> None:
    node = Node(window=0.01)
    node.large_owed()  # "large" (duty 90) yielded, "small" (duty 10) waits
    node.table.enqueue("large", ["g"], duty=90)
    [granted] = node.granted()
    assert granted == "large"
    lease = node.table.leases_of("large")[0]
    # "small" is at 0.05 / 0.1 = 0.5 of virtual time, "large" at 0.05 / 0.9: it may hold
    # (0.5 - 0.0556) * 0.9 = 0.4 s in all before "small" comes first, less the window.
    expected = (0.05 / 0.1 - 0.05 / 0.9) * 0.9 - 0.01
    assert node.table.keeping.keep_for(lease) == pytest.approx(expected)
    node.table.enqueue("mid", ["g"], duty=90)  # a newcomer at the GPU's clock: nearer
    assert node.table.keeping.keep_for(lease) < expected


def test_nothing_is_kept_where_nobody_waits_under_fifo_or_for_one_that_does_not_come_back() -> None:
    node = Node()
    node.table.enqueue("a", ["g"], duty=50)
    [_] = node.granted()
    lease = node.table.leases_of("a")[0]
    assert node.table.keeping.keep_for(lease) == 0.0  # nobody waits: a yield hands nothing over
    node.now += 0.05
    node.table.enqueue("b", ["g"], duty=50)
    assert node.table.keeping.keep_for(lease) == 0.0  # "b" has had nothing: "a" is not owed
    owed = Node()
    owed.large_owed()
    owed.table.enqueue("large", ["g"], duty=90)
    owed.granted()
    [kept] = owed.table.leases_of("large")
    assert owed.table.keeping.keep_for(kept) > 0
    owed.table.anticipation.return_s["large"] = 0.5  # one that does not come straight back
    assert owed.table.keeping.keep_for(kept) == 0.0
    fifo = LeaseTable(clock=lambda: 0.0, policy="fifo")
    fifo.enqueue("a", ["g"])
    fifo_lease = fifo.grant(fifo.pick()[0].waiter_id)
    fifo.enqueue("b", ["g"])
    assert fifo.keeping.keep_for(fifo_lease) == 0.0


def test_a_kept_lease_given_back_late_is_held_and_learnt_from_its_callers_yield() -> None:
    node = Node(window=0.01)
    node.large_owed()  # "large" holds nothing now; make it hold again, then give it back late
    node.table.enqueue("large", ["g"], duty=90)
    [lease] = [node.table.grant(w.waiter_id) for w in node.table.pick()]
    node.now += 0.05
    node.table.release(lease.lease_id, yielded=True, kept_s=0.012)  # its caller: 12 ms ago
    assert node.table.anticipation.held_for("g", node.now) is None  # its window has passed
    node.now += 0.001
    node.table.enqueue("large", ["g"], duty=90)
    assert node.table.anticipation.return_s["large"] == pytest.approx(0.25 * 0.013)
    again = node.table.grant(node.table.pick()[0].waiter_id)
    node.now += 0.05
    node.table.release(again.lease_id, yielded=True, kept_s=0.004)
    hold = node.table.anticipation.holds["g"]
    assert hold.until == pytest.approx(node.now - 0.004 + 0.01)  # a window from its caller's

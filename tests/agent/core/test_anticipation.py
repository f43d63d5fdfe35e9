"""Anticipation: a GPU kept briefly for an owed yielder, at no cost when nobody is owed."""

from __future__ import annotations

import pytest

from agent.core.anticipation import Anticipation
from agent.core.fair import FairConfig, FairShare
from agent.core.leases import LeaseTable


class Node:
    """One GPU under the fair policy with an injected clock."""

    def __init__(self, window: float = 0.01) -> None:
        self.now = 0.0
        self.policy = FairShare(FairConfig(anticipate_s=window))
        self.table = LeaseTable(clock=lambda: self.now, policy=self.policy, max_hold=60)

    def turn(self, tenant: str, seconds: float, duty: int = 50) -> None:
        """`tenant` asks, is granted at once, holds `seconds` and yields."""
        self.table.enqueue(tenant, ["g"], duty=duty)
        [waiter] = [w for w in self.table.pick() if w.tenant_id == tenant]
        lease = self.table.grant(waiter.waiter_id)
        self.now += seconds
        self.table.release(lease.lease_id, yielded=True)

    def granted(self) -> list[str]:
        return [self.table.grant(w.waiter_id).tenant_id for w in self.table.pick()]

    def large_owed(self) -> None:
        """ "small" (duty 10) had a turn; "large" (duty 90) just yielded its own, "small" waits."""
        self.table.enqueue("small", ["g"], duty=10)
        self.table.enqueue("large", ["g"], duty=90)
        [small] = self.granted()
        self.now += 0.05
        self.table.release(self.table.leases_of(small)[0].lease_id, yielded=True)
        assert self.granted() == ["large"]  # "small" is not owed: nobody waits for it
        self.table.enqueue("small", ["g"], duty=10)
        self.now += 0.05
        self.table.release(self.table.leases_of("large")[0].lease_id, yielded=True)


def test_an_owed_yielder_that_asks_straight_back_is_served_before_the_waiter() -> None:
    node = Node()
    node.large_owed()  # behind "small" by virtual time, though it just ran
    assert node.granted() == []  # the GPU is kept for the yielder
    node.now += 0.0005
    node.table.enqueue("large", ["g"], duty=90)
    assert node.granted() == ["large"]
    # Its virtual time paid for the half millisecond the waiter was kept out.
    assert node.policy.vtime["large"] == pytest.approx((0.05 + 0.0005) / 0.9)
    assert node.policy.vtime["small"] == pytest.approx(0.05 / 0.1)


def test_nobody_waits_for_a_yielder_that_is_not_owed() -> None:
    node = Node()
    node.turn("a", 0.05)
    node.table.enqueue("b", ["g"], duty=50)  # b has had nothing: a is not owed
    assert node.granted() == ["b"]
    assert node.policy.vtime["a"] == pytest.approx(0.05 / 0.5)  # no hold charged


def test_a_hold_that_kept_nobody_out_costs_nothing() -> None:
    node = Node()
    node.turn("a", 0.05)
    node.now += 0.005
    node.table.enqueue("a", ["g"], duty=50)
    assert node.granted() == ["a"]
    assert node.policy.vtime["a"] == pytest.approx(0.05 / 0.5)


def test_a_yielder_that_does_not_come_back_keeps_the_gpu_for_the_window_only() -> None:
    node = Node(window=0.01)
    node.large_owed()
    assert node.granted() == []
    assert node.table.next_deadline(after=node.now) == pytest.approx(0.11)
    node.now = 0.11
    assert node.table.tick().unheld == ["g"]
    assert node.granted() == ["small"]
    assert node.policy.vtime["large"] == pytest.approx((0.05 + 0.01) / 0.9)


def test_a_yielder_that_leaves_frees_the_gpu_at_once() -> None:
    node = Node()
    node.large_owed()
    assert node.granted() == []
    node.table.drop_tenant("large")
    assert node.granted() == ["small"]


def test_a_tenant_usually_away_longer_than_the_window_is_not_waited_for() -> None:
    node = Node(window=0.01)
    for _ in range(3):
        node.turn("large", 0.05, duty=90)
        node.now += 0.5  # it is away half a second after each turn
    node.large_owed()
    assert node.granted() == ["small"]


def test_anticipation_is_off_with_a_zero_window_and_under_fifo() -> None:
    node = Node(window=0.0)
    node.large_owed()
    assert node.granted() == ["small"]
    now = [0.0]
    fifo = LeaseTable(clock=lambda: now[0], policy="fifo")
    assert fifo.anticipation.window_s == 0.0


def test_return_times_are_learnt_as_a_running_mean() -> None:
    ant = Anticipation(window_s=0.01)
    ant.yielded("t", ["g"], 0.0)
    ant.asked("t", 0.004)
    assert ant.return_s["t"] == pytest.approx(0.004)
    ant.yielded("t", ["g"], 1.0)
    ant.asked("t", 2.0)  # a long absence counts as twice the window, no more
    assert ant.return_s["t"] == pytest.approx(0.004 + 0.25 * (0.02 - 0.004))
    with pytest.raises(ValueError):
        Anticipation(window_s=-1.0)


def test_may_keep_says_before_the_yield_what_the_hold_would_decide_at_it() -> None:
    # The park-at-yield hint (agent.server.yield_parks) is not given to a holder the GPU may be
    # kept for at its yield: it would park itself for nothing.
    node = Node()
    node.table.enqueue("small", ["g"], duty=10)
    node.table.enqueue("large", ["g"], duty=90)
    [small] = node.granted()
    node.now += 0.05
    node.table.release(node.table.leases_of(small)[0].lease_id, yielded=True)
    assert node.granted() == ["large"]
    waiter = node.table.enqueue("small", ["g"], duty=10)
    assert node.table.keeping.may_keep("large", waiter)  # owed: its yield would keep the GPU for it
    node.table.anticipation.return_s["large"] = 0.5  # one that does not come straight back
    assert not node.table.keeping.may_keep("large", waiter)
    fifo = LeaseTable(clock=lambda: 0.0, policy="fifo")  # no holds under FIFO
    assert not fifo.keeping.may_keep("large", fifo.enqueue("small", ["g"]))
    unowed = Node()
    unowed.turn("a", 0.05)
    assert not unowed.table.keeping.may_keep("a", unowed.table.enqueue("b", ["g"], duty=50))

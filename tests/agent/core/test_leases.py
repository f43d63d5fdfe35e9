"""The lease table: invariants under random operation sequences, and its edge cases."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from agent.core.errors import AlreadyHolding, NotOwner, UnknownLease
from agent.core.leases import LeaseTable, Waiter

GPUS = ("g0", "g1", "g2")
TENANTS = ("t0", "t1", "t2", "t3")


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _ids() -> itertools.count[int]:
    return itertools.count(1)


def make_table(policy: str = "fifo", max_hold: float = 10.0) -> tuple[LeaseTable, Clock]:
    clock = Clock()
    counter = _ids()
    table = LeaseTable(
        clock=clock, policy=policy, max_hold=max_hold, new_id=lambda: f"w{next(counter)}"
    )
    return table, clock


def order_key(table: LeaseTable, waiter: Waiter) -> int:
    return [w.waiter_id for w in table.queue()].index(waiter.waiter_id)


class LeaseTableMachine(RuleBasedStateMachine):
    """Random enqueues, cancels, grants, blocks, yields, revocations, departures and time."""

    policy = "fifo"

    def __init__(self) -> None:
        super().__init__()
        self.table, self.clock = make_table(self.policy)
        self.last_token = dict.fromkeys(GPUS, 0)

    @rule(
        tenant=st.sampled_from(TENANTS),
        gpus=st.sets(st.sampled_from(GPUS), min_size=1, max_size=3),
        timeout=st.none() | st.floats(0.5, 20),
    )
    def enqueue(self, tenant: str, gpus: set[str], timeout: float | None) -> None:
        try:
            self.table.enqueue(tenant, gpus, timeout=timeout)
        except AlreadyHolding:
            mine = [w for w in self.table.waiters.values() if w.tenant_id == tenant]
            held = [ls for ls in self.table.leases.values() if ls.tenant_id == tenant]
            wanted = [set(x.gpus) for x in mine] + [set(x.gpus) for x in held]
            assert any(w & gpus for w in wanted)

    @precondition(lambda self: self.table.waiters)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        waiter_id = data.draw(st.sampled_from(sorted(self.table.waiters)))
        self.table.cancel(waiter_id)
        assert waiter_id not in self.table.waiters
        assert all(s.holder != waiter_id for s in self.table.gpus.values())

    @rule(block=st.lists(st.booleans(), max_size=4))
    def pick_and_grant(self, block: list[bool]) -> None:
        before = [w for w in self.table.queue() if not w.blocked and not w.reserved]
        chosen = self.table.pick()
        self.check_progress()
        for waiter in chosen:  # nobody ahead of a chosen waiter (in policy order) wanted its GPUs
            for other in before:
                if other in chosen or not set(other.gpus) & set(waiter.gpus):
                    continue
                assert order_key(self.table, other) > order_key(self.table, waiter)
        for waiter, blocked in zip(chosen, block + [False] * len(chosen), strict=False):
            if blocked:
                self.table.block(waiter.waiter_id, "no room")
                continue
            lease = self.table.grant(waiter.waiter_id)
            for gpu, token in lease.tokens.items():
                assert token > self.last_token[gpu], "fencing tokens increase per GPU"
                self.last_token[gpu] = token

    @precondition(lambda self: self.table.leases)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        lease_id = data.draw(st.sampled_from(sorted(self.table.leases)))
        self.table.release(lease_id)
        with pytest.raises(UnknownLease):
            self.table.release(lease_id)

    @rule(seconds=st.floats(0.1, 15))
    def advance(self, seconds: float) -> None:
        self.clock.now += seconds
        tick = self.table.tick()
        for waiter in tick.expired:
            assert waiter.deadline is not None and waiter.deadline <= self.clock.now
            assert waiter.waiter_id not in self.table.waiters
        for lease in tick.overdue:
            assert lease.hold_until <= self.clock.now and self.table.contended(lease)
            _, due, resumed = self.table.revoke(lease.lease_id)
            assert resumed.front and all(w.reserved for w in due)
            waiting = [w for w in self.table.queue() if not w.reserved]
            ahead = waiting[: waiting.index(resumed)]
            assert all(w.front for w in ahead)  # first after the turns now due

    @rule()
    def unblock(self) -> None:
        self.table.unblock_all()
        assert not any(w.blocked for w in self.table.waiters.values())

    @rule(tenant=st.sampled_from(TENANTS))
    def depart(self, tenant: str) -> None:
        self.table.drop_tenant(tenant)
        assert all(w.tenant_id != tenant for w in self.table.waiters.values())
        assert all(ls.tenant_id != tenant for ls in self.table.leases.values())

    @invariant()
    def one_holder_per_gpu(self) -> None:
        for gpu in GPUS:
            holders = [ls for ls in self.table.leases.values() if gpu in ls.gpus]
            reserving = [w for w in self.table.waiters.values() if w.reserved and gpu in w.gpus]
            assert len(holders) + len(reserving) <= 1
            expected = (holders or reserving or [None])[0]
            holder = self.table.gpu(gpu).holder
            if expected is None:
                assert holder is None
            else:
                assert holder == getattr(expected, "lease_id", getattr(expected, "waiter_id", ""))

    def check_progress(self) -> None:
        """After a pick, each eligible waiter is held up by a busy GPU or by a waiter ahead."""
        claimed: set[str] = set()
        for waiter in self.table.queue():
            if waiter.blocked:
                continue
            busy = {g for g in waiter.gpus if self.table.gpu(g).holder is not None}
            assert waiter.reserved or busy or set(waiter.gpus) & claimed, "stuck on free GPUs"
            claimed |= set(waiter.gpus)


class LrsLeaseTableMachine(LeaseTableMachine):
    """The same invariants under least-recently-served ordering."""

    policy = "lrs"


TestLeaseTableMachine = LeaseTableMachine.TestCase
TestLeaseTableMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestLrsLeaseTableMachine = LrsLeaseTableMachine.TestCase
TestLrsLeaseTableMachine.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)


@settings(max_examples=80, deadline=None)
@given(
    requests=st.lists(
        st.tuples(
            st.sampled_from(TENANTS),
            st.sets(st.sampled_from(GPUS), min_size=1, max_size=3),
            st.none() | st.floats(0.5, 30),
        ),
        max_size=12,
    ),
    hold=st.floats(0.1, 5),
)
def test_every_waiter_is_granted_or_times_out(
    requests: list[tuple[str, set[str], float | None]], hold: float
) -> None:
    table, clock = make_table()
    queued = {}
    for tenant, gpus, timeout in requests:
        try:
            waiter = table.enqueue(tenant, gpus, timeout=timeout)
        except AlreadyHolding:
            continue
        queued[waiter.waiter_id] = waiter
    granted, expired = set(), set()
    for _ in range(len(queued) + 1):  # each round grants at least the head of the queue
        for waiter in table.pick():
            granted.add(table.grant(waiter.waiter_id).lease_id)
        clock.now += hold
        expired |= {w.waiter_id for w in table.tick().expired}
        for lease_id in list(table.leases):
            table.release(lease_id)
        if not table.waiters:
            break
    assert not table.waiters
    assert granted | expired == set(queued) and not granted & expired


@pytest.mark.parametrize("policy", ["fifo", "lrs"])
@settings(max_examples=40, deadline=None)
@given(
    tenants=st.integers(2, 4),
    holds=st.lists(st.floats(0.001, 10), min_size=4, max_size=30),
    duties=st.lists(st.integers(1, 100), min_size=4, max_size=4),
)
def test_no_tenant_starves(
    policy: str, tenants: int, holds: list[float], duties: list[int]
) -> None:
    """Every tenant re-queues right after its turn; none waits `tenants` turns or more."""
    table, clock = make_table(policy)
    names = TENANTS[:tenants]
    for tenant, duty in zip(names, duties, strict=False):
        table.enqueue(tenant, ["g0"], duty=duty)
    waited = dict.fromkeys(names, 0)
    for hold in holds:
        (waiter,) = table.pick()
        lease = table.grant(waiter.waiter_id)
        for tenant in names:
            waited[tenant] = 0 if tenant == lease.tenant_id else waited[tenant] + 1
            assert waited[tenant] < tenants, f"{tenant} starved under {policy}"
        clock.now += hold
        table.release(lease.lease_id)
        table.enqueue(lease.tenant_id, ["g0"], duty=duties[names.index(lease.tenant_id)])


def test_fifo_serves_in_arrival_order() -> None:
    table, _ = make_table("fifo")
    for tenant in ("t2", "t0", "t1"):
        table.enqueue(tenant, ["g0"])
    served = []
    while table.waiters:
        (waiter,) = table.pick()
        served.append(table.grant(waiter.waiter_id).tenant_id)
        table.release(waiter.waiter_id)
    assert served == ["t2", "t0", "t1"]


def test_lrs_prefers_the_tenant_served_longest_ago() -> None:
    table, clock = make_table("lrs")
    for tenant in ("t0", "t1"):
        table.enqueue(tenant, ["g0"])
        (waiter,) = table.pick()
        table.grant(waiter.waiter_id)
        clock.now += 1
        table.release(waiter.waiter_id)
    table.enqueue("t1", ["g0"])
    table.enqueue("t0", ["g0"])  # queued later, but served longer ago
    (first,) = table.pick()
    assert first.tenant_id == "t0"


def test_multi_gpu_waiter_is_not_overtaken_on_its_gpus() -> None:
    table, _ = make_table()
    table.enqueue("t0", ["g0"])
    (holder,) = table.pick()
    table.grant(holder.waiter_id)
    wide = table.enqueue("t1", ["g0", "g1"])
    narrow = table.enqueue("t2", ["g1"])
    assert table.pick() == []  # g1 is free, but t1 came first and wants it too
    table.release(holder.waiter_id)
    assert table.pick() == [wide]
    assert narrow.waiter_id in table.waiters


def test_revoked_holder_goes_first_and_gets_a_higher_token() -> None:
    table, clock = make_table(max_hold=5)
    table.enqueue("t0", ["g0"])
    (first,) = table.pick()
    lease = table.grant(first.waiter_id)
    table.enqueue("t1", ["g0"])
    clock.now += 4
    assert table.tick().overdue == []
    assert table.next_deadline() == lease.hold_until
    clock.now += 1
    (overdue,) = table.tick().overdue
    _, (due,), resumed = table.revoke(overdue.lease_id)
    assert due.tenant_id == "t1" and resumed.front and resumed.tenant_id == "t0"
    table.enqueue("t2", ["g0"])
    assert [w.tenant_id for w in table.queue() if not w.reserved] == ["t0", "t2"]
    table.release(table.grant(due.waiter_id).lease_id)
    (again,) = table.pick()
    assert again is resumed
    assert table.grant(again.waiter_id).tokens["g0"] == lease.tokens["g0"] + 2


def test_a_revocation_hands_the_gpu_to_a_waiter_blocked_before_it() -> None:
    table, clock = make_table(max_hold=5)
    table.enqueue("t0", ["g0"])
    (first,) = table.pick()
    table.grant(first.waiter_id)
    waiter = table.enqueue("t1", ["g0"])
    waiter.blocked = "t0 holds [g0] past its maximum but could not be parked"  # `Revocations`
    clock.now += 5
    (overdue,) = table.tick().overdue
    _, due, resumed = table.revoke(overdue.lease_id)
    assert due == [waiter] and not resumed.reserved


def test_holding_alone_past_max_hold_is_not_overdue() -> None:
    table, clock = make_table(max_hold=1)
    table.enqueue("t0", ["g0"])
    (waiter,) = table.pick()
    table.grant(waiter.waiter_id)
    clock.now += 100
    assert table.tick().overdue == []


def test_ownership_and_double_requests_are_refused() -> None:
    table, _ = make_table()
    table.enqueue("t0", ["g0", "g1"])
    (waiter,) = table.pick()
    lease = table.grant(waiter.waiter_id)
    with pytest.raises(NotOwner, match="t0"):
        table.lease(lease.lease_id, "t1")
    with pytest.raises(UnknownLease):
        table.lease("nope", "t0")
    with pytest.raises(AlreadyHolding):
        table.enqueue("t0", ["g1"])

"""Who is due next on a held GPU (pure, over the lease table): the first waiter, or if nobody
waits, the tenant whose turn followed the holder's previous one."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.ahead import busy_tenants, due_next
from agent.core.leases import Lease, LeaseTable

from .test_leases import make_table

G = "g0"


def turn(table: LeaseTable, tenant: str, gpus: tuple[str, ...] = (G,)) -> Lease:
    """Queue `tenant` and grant it at once (the GPU must be free)."""
    waiter = table.enqueue(tenant, gpus)
    assert [w.waiter_id for w in table.pick()] == [waiter.waiter_id]
    return table.grant(waiter.waiter_id)


def due(table: LeaseTable) -> list[tuple[str, tuple[str, ...]]]:
    return [(d.tenant_id, d.gpus) for d in due_next(table)]


def test_the_first_waiter_of_a_held_gpu_is_due():
    table, _ = make_table()
    turn(table, "a")
    table.enqueue("b", [G])
    table.enqueue("c", [G])
    assert due(table) == [("b", (G,))]


def test_nothing_is_due_on_a_free_gpu_or_before_a_holders_second_turn():
    table, _ = make_table()
    assert due(table) == []
    lease = turn(table, "a")
    assert due(table) == []  # a's first turn: no cycle to go by yet
    table.release(lease.lease_id)
    assert due(table) == []


def test_when_nobody_waits_the_turn_that_followed_the_holders_last_is_expected():
    table, clock = make_table()
    for name in "abc":
        clock.now += 1
        table.release(turn(table, name).lease_id)
    clock.now += 1
    turn(table, "a")
    assert due(table) == [("b", (G,))]
    table.enqueue("c", [G])  # someone waits: the queue says who is next
    assert due(table) == [("c", (G,))]


def test_a_tenant_that_stopped_taking_turns_is_never_expected():
    table, clock = make_table()
    for name in "dabab":  # d took one turn long ago, then only a and b
        clock.now += 1
        table.release(turn(table, name).lease_id)
    clock.now += 1
    turn(table, "a")
    assert due(table) == [("b", (G,))]
    table.drop_tenant("b")
    assert due(table) == []


def test_a_blocked_first_waiter_is_not_due():
    table, _ = make_table()
    turn(table, "a")
    waiter = table.enqueue("b", [G])
    waiter.blocked = "no room"
    assert due(table) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcd"), st.sampled_from(["g0", "g1", "both"]))))
def test_no_one_due_next_holds_a_turn_or_is_being_granted_one(ops):
    table, clock = make_table()
    for tenant, where in ops:
        clock.now += 1
        gpus = ["g0", "g1"] if where == "both" else [where]
        mine = table.leases_of(tenant)
        if mine:
            table.release(mine[0].lease_id)
        elif not any(w.tenant_id == tenant for w in table.waiters.values()):
            table.enqueue(tenant, gpus)
        for waiter in table.pick():
            table.grant(waiter.waiter_id)
        busy = busy_tenants(table)
        for d in due_next(table):
            assert d.tenant_id not in busy
            assert any(set(d.gpus) & set(lease.gpus) for lease in table.leases.values())

"""The wait bound holds for the lease table: under fifo and lrs no waiter sees more turns ahead
of it than `WaitBound.turns_ahead` allows, whatever the order of yields and revocations."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.leases import LeaseTable, Waiter
from agent.core.waitbound import WaitBound

G = "GPU-0"


@settings(max_examples=60, deadline=None)
@given(
    policy=st.sampled_from(["fifo", "lrs"]),
    tenants=st.integers(2, 6),
    steps=st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=5, max_size=80),
)
def test_no_waiter_sees_more_turns_ahead_than_the_bound_allows(
    policy: str, tenants: int, steps: list[tuple[int, bool]]
) -> None:
    now = [0.0]
    table = LeaseTable(clock=lambda: now[0], policy=policy, max_hold=1.0)
    names = [f"t{i}" for i in range(tenants)]
    waiting: dict[str, list[int]] = {}  # tenant -> [turns ahead so far, revoked holders resumed]

    def queue(tenant: str) -> None:
        busy = {w.tenant_id for w in table.waiters.values()} | {
            lease.tenant_id for lease in table.leases.values()
        }
        if tenant not in busy:
            table.enqueue(tenant, [G])
            waiting[tenant] = [1 if table.leases else 0, 0]

    def grant_due(reserved: list[Waiter]) -> None:
        for waiter in reserved + table.pick():
            lease = table.grant(waiter.waiter_id)
            for other, seen in waiting.items():
                if other != lease.tenant_id:
                    seen[0] += 1
            mine = waiting.pop(lease.tenant_id, None)
            if mine is not None and not waiter.front:
                allowed = WaitBound.turns_ahead(tenants - 1, mine[1])
                assert mine[0] <= allowed, (lease.tenant_id, mine, policy)

    for name in names:
        queue(name)
    grant_due([])
    for pick, revoke in steps:
        now[0] += 0.5
        queue(names[pick % tenants])
        held = list(table.leases.values())
        due: list[Waiter] = []
        if held:
            if revoke and table.contended(held[0]):
                _, due, _ = table.revoke(held[0].lease_id)
                for seen in waiting.values():
                    seen[1] += 1
            else:
                table.release(held[0].lease_id)
        grant_due(due)


@pytest.mark.parametrize(("ahead", "expected"), [(0, 1.0), (1, 3.0), (7, 15.0)])
def test_the_longest_wait_adds_a_hold_and_a_handover_per_turn_ahead(ahead, expected):
    assert WaitBound(max_hold=1.0, handover=1.0).longest_wait(ahead) == expected


def test_a_contended_turn_ends_a_handover_after_its_hold_or_its_first_waiter():
    bound = WaitBound(max_hold=2.0, handover=0.5)
    assert bound.turn_ends_by(granted_at=10.0, contended_at=11.0) == 12.5
    assert bound.turn_ends_by(granted_at=10.0, contended_at=20.0) == 20.5

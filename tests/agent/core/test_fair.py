"""The fair policy: shares converge to duties, nobody starves, one holder per GPU, tiers hold."""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core import fair
from agent.core.errors import AlreadyHolding
from agent.core.fair import FairConfig, FairShare
from agent.core.leases import LeaseTable


@dataclass
class Spec:
    """A tenant of the simulation: its duty, tier, turn length and idle time between turns."""

    duty: int
    turn: float
    gap: float = 0.0
    tier: int = 0
    reconnects: bool = False
    """It leaves the node after each turn (its session closed) and comes back as itself."""


@dataclass
class Result:
    held: dict[str, float]
    max_wait: dict[str, float]
    turns: list[tuple[str, float]]


RETURN_S = 0.001
"""A tenant asks again no sooner than this after its yield (the answer, then its request)."""


def simulate(specs: dict[str, Spec], seconds: float, config: FairConfig | None = None) -> Result:
    """Run tenants on one GPU under the fair policy for `seconds` of injected time, in the
    order a client sees events: a tenant asks again `gap` plus `RETURN_S` after its yield."""
    now = [0.0]
    ids = itertools.count()
    table = LeaseTable(
        clock=lambda: now[0],
        policy=FairShare(config or FairConfig()),
        max_hold=1e9,
        new_id=lambda: f"w{next(ids)}",
    )
    wake = dict.fromkeys(specs, 0.0)
    since: dict[str, float] = {}
    result = Result(dict.fromkeys(specs, 0.0), dict.fromkeys(specs, 0.0), [])
    holder: tuple[str, str, float] | None = None  # tenant, lease id, release time
    while now[0] < seconds:
        for name, at in list(wake.items()):
            if at <= now[0]:
                table.enqueue(name, ["g"], duty=specs[name].duty, tier=specs[name].tier)
                since[name] = now[0]
                del wake[name]
        table.tick()
        if holder is None:
            for waiter in table.pick():
                lease = table.grant(waiter.waiter_id)
                t = lease.tenant_id
                result.max_wait[t] = max(result.max_wait[t], now[0] - since.pop(t))
                holder = (t, lease.lease_id, now[0] + specs[t].turn)
                result.turns.append((t, now[0]))
        assert len(table.leases) <= 1
        due = table.next_deadline(after=now[0])
        nxt = min([*wake.values(), holder[2] if holder else float("inf"), due or float("inf")])
        now[0] = min(nxt, seconds)
        if holder is not None and holder[2] <= now[0]:
            t, lease_id, _ = holder
            table.release(lease_id, yielded=True)
            if specs[t].reconnects:
                table.drop_tenant(t)
            result.held[t] += specs[t].turn
            wake[t] = now[0] + specs[t].gap + RETURN_S
            holder = None
    for t, start in since.items():  # still waiting at the end
        result.max_wait[t] = max(result.max_wait[t], seconds - start)
    return result


duties = st.integers(min_value=5, max_value=100)
turns = st.floats(min_value=0.05, max_value=1.0)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(duties, turns), min_size=2, max_size=5))
def test_shares_converge_to_duties_for_busy_tenants(tenants: list[tuple[int, float]]) -> None:
    specs = {f"t{i}": Spec(duty, turn) for i, (duty, turn) in enumerate(tenants)}
    seconds = 300.0
    result = simulate(specs, seconds)
    total = sum(s.duty for s in specs.values())
    for name, spec in specs.items():
        assert result.held[name] / seconds == pytest.approx(spec.duty / total, abs=0.03)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.tuples(duties, turns, st.floats(0.0, 5.0)), min_size=2, max_size=5),
    st.floats(0.0, 20.0),
)
def test_nobody_starves(tenants: list[tuple[int, float, float]], credit: float) -> None:
    specs = {f"t{i}": Spec(duty, turn, gap) for i, (duty, turn, gap) in enumerate(tenants)}
    result = simulate(specs, 300.0, FairConfig(credit_s=credit))
    for name in specs:
        assert result.max_wait[name] <= longest_wait(specs, name, credit) + 1e-6
        assert result.held[name] > 0


def longest_wait(specs: dict[str, Spec], name: str, credit: float) -> float:
    """The most one tier's waiter `name` can wait for its turn under the fair policy."""
    window = FairConfig().anticipate_s
    # While the waiter W waits, its virtual time V is at most the GPU's clock plus its last
    # turn over its weight (the clock reached W's start S at its last grant; V = S + turn/w).
    # Every other tenant j is at or above S less its credit (floored at S or later on joining,
    # or still waiting behind W at S), so j starts turns only while below V: that is credit,
    # plus W's last turn scaled by j's weight over W's, plus the turn that crosses V; add the
    # turn in progress when W queued (one of j's turns at most). A GPU kept for j after its
    # yield (at most the anticipation window, charged to j) lengthens each of j's turns by that.
    spec = specs[name]
    others = [s for n, s in specs.items() if n != name]
    return sum(
        credit + 2 * (s.turn + window) + (spec.turn + window) * s.duty / spec.duty for s in others
    )


def test_those_who_return_during_a_turn_bank_no_more_than_the_credit() -> None:
    # t0 runs while the others sit in their gaps; they come back during its turn. Their floor
    # must be the virtual time of that turn, not the clock before it, or t0 waits 14.5 s.
    tenants = [(5, 1.0, 0.0), (5, 0.5, 3.0), (8, 1.0, 2.0), (16, 1.0, 0.5)]
    specs = {f"t{i}": Spec(duty, turn, gap) for i, (duty, turn, gap) in enumerate(tenants)}
    result = simulate(specs, 300.0, FairConfig(credit_s=1.0))
    for name in specs:
        assert result.max_wait[name] <= longest_wait(specs, name, 1.0) + 1e-6
    assert result.max_wait["t0"] <= 13.8 + 1e-6


def test_a_turn_in_progress_sets_the_floor_for_those_who_join() -> None:
    policy = FairShare(FairConfig(credit_s=1.0))
    now = [0.0]
    table = LeaseTable(clock=lambda: now[0], policy=policy, max_hold=1e9)
    table.enqueue("b", ["g"], duty=50)
    lease = table.grant(table.pick()[0].waiter_id)
    now[0] = 1.0
    table.release(lease.lease_id)  # "b" has had 1 s: virtual time 2, and so has the clock
    table.enqueue("a", ["g"], duty=50)
    policy.vtime["a"] = 30.0  # "a" ran ahead while nobody else wanted the GPU
    table.grant(table.pick()[0].waiter_id)
    table.enqueue("b", ["g"], duty=50)
    assert policy.vtime["b"] == pytest.approx(30.0 - 1.0 / 0.5)


@settings(max_examples=30, deadline=None)
@given(turns, turns, st.sampled_from([0.0, 0.1, 0.25]))
def test_a_higher_tier_goes_first_and_a_lower_one_keeps_its_minimum(
    high_turn: float, low_turn: float, min_share: float
) -> None:
    specs = {"high": Spec(50, high_turn, tier=1), "low": Spec(50, low_turn, tier=0)}
    seconds = 600.0
    result = simulate(specs, seconds, FairConfig(min_share=min_share, credit_s=5.0))
    low = result.held["low"] / seconds
    if min_share == 0.0:
        assert result.held["low"] <= low_turn  # at most the one turn it took before high came
    else:
        assert low == pytest.approx(min_share, abs=0.03)
        assert result.max_wait["low"] <= high_turn * (1 / min_share + 1) + 5.0 / min_share


def test_the_higher_tier_is_chosen_at_the_next_yield() -> None:
    specs = {"low1": Spec(50, 1.0), "low2": Spec(50, 1.0), "high": Spec(50, 1.0, 0.5, tier=1)}
    result = simulate(specs, 20.0, FairConfig(min_share=0.0))
    starts = [t for t, _ in result.turns]
    # After its first turn the high tier never waits behind more than the turn in progress.
    assert result.max_wait["high"] <= 1.0 + 1e-9
    assert starts.count("high") >= 9


def test_idle_time_is_banked_only_up_to_the_credit() -> None:
    # "late" sleeps 100 s, then both are busy: it may run ahead by its credit, no more.
    config = FairConfig(credit_s=2.0)
    now = [0.0]
    table = LeaseTable(clock=lambda: now[0], policy=FairShare(config), max_hold=1e9)
    for _ in range(1000):  # busy alone for 100 s
        table.enqueue("busy", ["g"], duty=50)
        lease = table.grant(table.pick()[0].waiter_id)
        now[0] += 0.1
        table.release(lease.lease_id)
    table.enqueue("late", ["g"], duty=50)
    table.enqueue("busy", ["g"], duty=50)
    run = 0
    while table.pick()[0].tenant_id == "late":
        waiter = next(w for w in table.waiters.values() if w.reserved)
        lease = table.grant(waiter.waiter_id)
        now[0] += 0.1
        table.release(lease.lease_id)
        table.enqueue("late", ["g"], duty=50)
        run += 1
    assert 0 < run <= 2.0 / 0.1 + 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.floats(0.0, 2.0)), max_size=60))
def test_at_most_one_holder_per_gpu(ops: list[tuple[int, int, float]]) -> None:
    now = [0.0]
    table = LeaseTable(
        clock=lambda: now[0],
        policy=FairShare(FairConfig(tier_grace_s=0.5)),
        max_hold=1.0,
    )
    gpus = [("g0",), ("g1",), ("g0", "g1"), ("g1",)]
    for tenant, op, dt in ops:
        now[0] += dt
        name = f"t{tenant}"
        if op == 0 and not table.leases_of(name):
            with contextlib.suppress(AlreadyHolding):
                table.enqueue(name, gpus[tenant], duty=25 * (tenant + 1), tier=tenant % 2)
        elif op == 1:
            for waiter in table.pick():
                table.grant(waiter.waiter_id)
        elif op == 2 and table.leases_of(name):
            table.release(table.leases_of(name)[0].lease_id, yielded=dt < 1.0)
        else:
            for lease in table.tick().overdue:
                _, due, _ = table.revoke(lease.lease_id)
                for waiter in due:
                    table.grant(waiter.waiter_id)
        holders: dict[str, str] = {}
        for lease in table.leases.values():
            for gpu in lease.gpus:
                assert gpu not in holders, f"{gpu} held by {holders[gpu]} and {lease.lease_id}"
                holders[gpu] = lease.lease_id
                assert table.gpu(gpu).holder == lease.lease_id


def test_a_lower_tier_holder_is_revocable_after_the_grace() -> None:
    now = [100.0]
    table = LeaseTable(
        clock=lambda: now[0], policy=FairShare(FairConfig(tier_grace_s=2.0)), max_hold=60
    )
    table.enqueue("low", ["g"], tier=0)
    lease = table.grant(table.pick()[0].waiter_id)
    now[0] = 105.0
    table.enqueue("high", ["g"], tier=1)
    assert table.revoke_at(lease) == 107.0
    assert table.next_deadline(after=now[0]) == 107.0
    now[0] = 107.0
    assert [x.lease_id for x in table.tick().overdue] == [lease.lease_id]


def test_a_holder_another_arbiter_decides_for_is_not_revoked_for_a_tier() -> None:
    """A job's member (the cluster coordinator decides its turns): revoking it here would leave
    its job's members on other nodes holding their GPUs; only the maximum hold applies."""
    now = [100.0]
    table = LeaseTable(
        clock=lambda: now[0], policy=FairShare(FairConfig(tier_grace_s=2.0)), max_hold=60
    )
    table.anticipation.decided_elsewhere("member")
    table.enqueue("member", ["g"], tier=0)
    lease = table.grant(table.pick()[0].waiter_id)
    table.enqueue("high", ["g"], tier=1)
    assert table.revoke_at(lease) == lease.hold_until


def test_without_a_grace_a_lower_tier_holder_keeps_its_turn() -> None:
    now = [100.0]
    table = LeaseTable(clock=lambda: now[0], policy="fair", max_hold=60)
    table.enqueue("low", ["g"], tier=0)
    lease = table.grant(table.pick()[0].waiter_id)
    table.enqueue("high", ["g"], tier=1)
    assert table.revoke_at(lease) == lease.hold_until


def test_config_is_checked() -> None:
    with pytest.raises(ValueError):
        FairConfig(min_share=0.7)
    with pytest.raises(ValueError):
        FairConfig(tier_grace_s=-1)


def test_a_lower_tier_waiting_does_not_let_a_sleeper_bank_more_than_the_credit() -> None:
    # "late" and "busy" share tier 1; "low" (tier 0) waits throughout and takes its minimum
    # share. "late" sleeps 100 s while "busy" runs: back, it may run ahead by its credit, no
    # more. (Were the clock it is lifted to the least virtual time of every tier's waiters,
    # "low"'s, far behind, would hold it back, and "busy" would wait some 80 s.)
    config = FairConfig(credit_s=2.0, min_share=0.1)
    now = [0.0]
    table = LeaseTable(clock=lambda: now[0], policy=FairShare(config), max_hold=1e9)
    tiers = {"late": 1, "busy": 1, "low": 0}

    def turn() -> str:
        lease = table.grant(table.pick()[0].waiter_id)
        now[0] += 0.1
        table.release(lease.lease_id)
        return lease.tenant_id

    table.enqueue("low", ["g"], duty=50, tier=0)
    table.enqueue("late", ["g"], duty=50, tier=1)
    assert turn() == "late"  # then it sleeps
    table.enqueue("busy", ["g"], duty=50, tier=1)
    while now[0] < 100.0:  # "busy", with "low"'s minimum share
        done = turn()
        table.enqueue(done, ["g"], duty=50, tier=tiers[done])
    table.enqueue("late", ["g"], duty=50, tier=1)
    late_turns = 0
    while (done := turn()) != "busy":
        late_turns += done == "late"
        table.enqueue(done, ["g"], duty=50, tier=tiers[done])
    assert 0 < late_turns <= 2.0 / 0.1 + 1


def test_a_tenant_that_reconnects_between_turns_keeps_its_debt() -> None:
    # "greedy" closes its session after every turn and opens a new one under the same id.
    # Rejoining level with "other" each time, it would take every other turn: half the GPU.
    specs = {"greedy": Spec(10, 0.1, reconnects=True), "other": Spec(90, 0.1)}
    seconds = 100.0
    result = simulate(specs, seconds)
    assert result.held["greedy"] / seconds == pytest.approx(0.1, abs=0.03)
    assert result.held["other"] / seconds == pytest.approx(0.9, abs=0.03)


def test_a_departed_tenants_debt_is_forgotten_once_paid() -> None:
    now = [0.0]
    policy = FairShare()
    table = LeaseTable(clock=lambda: now[0], policy=policy, max_hold=1e9)

    def turn(tenant: str) -> None:
        table.enqueue(tenant, ["g"], duty=50)
        lease = table.grant(table.pick()[0].waiter_id)
        assert lease.tenant_id == tenant
        now[0] += 1.0
        table.release(lease.lease_id)

    table.enqueue("gone", ["g"], duty=50)
    lease = table.grant(table.pick()[0].waiter_id)
    table.enqueue("other", ["g"], duty=50)
    now[0] += 1.0
    table.release(lease.lease_id)  # "gone" is 2 virtual seconds ahead of "other", waiting
    table.drop_tenant("gone")
    assert policy.vtime["gone"] == pytest.approx(2.0)  # in debt: it comes back where it left
    table.cancel(next(iter(table.waiters)))
    turn("other")  # "other" runs level with it: the debt is paid
    turn("brief")
    table.drop_tenant("brief")  # a departure forgets the debts since paid
    assert "gone" not in policy.vtime and "brief" not in policy.vtime
    assert not policy.departed


def test_the_departed_remembered_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fair, "DEPARTED_MAX", 2)
    policy = FairShare()
    for name in ("a", "b", "c"):  # each left 1 virtual second ahead of the GPU's clock
        policy.vtime[name] = 1.0
        policy.left(name, ["g"], 0)
    assert list(policy.departed) == ["b", "c"] and set(policy.vtime) == {"b", "c"}

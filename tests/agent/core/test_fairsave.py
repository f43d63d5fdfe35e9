"""What of the fair policy survives an agent restart: each tenant's lag from its GPUs' clock of
its tier, the departed debts in the order they left, and the minimum-share balances."""

from __future__ import annotations

import json

import pytest

from agent.core import fairsave
from agent.core.fair import FairShare, clock_key
from agent.core.leases import LeaseTable


def test_lags_and_departed_debts_come_back_against_a_restarted_agents_clocks() -> None:
    old = FairShare()
    old.vclock = {clock_key("g", 0): 100.0, clock_key("g", 5): 40.0}
    old.vtime = {"ahead": 105.0, "behind": 97.0, "high": 41.0, "unplaced": 120.0}
    old.vtime |= {"left": 110.0, "left-high": 45.0}
    old.departed = {"left": (("g",), 0), "left-high": (("g",), 5)}
    old.balance = {("g", 0): 2.0, ("g", 5): 0.0}
    placed = {"ahead": (["g"], 0), "behind": (["g"], 0), "high": (["g"], 5)}

    text = json.dumps(fairsave.lags_of(old, placed).to_json())
    new = FairShare()  # a restarted agent's: no clocks yet
    fairsave.restore(new, fairsave.FairLags.from_json(json.loads(text)), placed)

    assert new.vtime == pytest.approx(
        {"ahead": 5.0, "behind": -3.0, "high": 1.0, "left": 10.0, "left-high": 5.0}
    ), "each where it stood against its clock; one with no GPUs known rejoins level"
    assert list(new.departed.items()) == [("left", (("g",), 0)), ("left-high", (("g",), 5))]
    assert new.balance == {("g", 0): 2.0}
    new.joined("behind", ["g"], duty=50)
    new.joined("newcomer", ["g"], duty=50)
    new.joined("left", ["g"], duty=50)
    assert new.vtime["behind"] == pytest.approx(-3.0), "its banked credit, within the credit"
    assert new.vtime["newcomer"] == 0.0, "a new tenant starts level"
    assert new.vtime["left"] == pytest.approx(10.0) and "left" not in new.departed


def test_another_shape_is_refused() -> None:
    for data in ({"tenants": [["a", 1.0]]}, {"balance": [["g", "x", 1.0]]}, {"departed": 3}):
        with pytest.raises((TypeError, ValueError)):
            fairsave.FairLags.from_json(data)


def test_a_tenant_gone_since_the_snapshot_keeps_only_a_debt() -> None:
    old = FairShare(vclock={"g": 10.0}, vtime={"owing": 12.0, "owed": 9.0})
    placed = {"owing": (["g"], 0), "owed": (["g"], 0)}
    new = FairShare()
    fairsave.restore(new, fairsave.lags_of(old, placed), present=())
    assert new.vtime == pytest.approx({"owing": 2.0}) and list(new.departed) == ["owing"]


def test_a_restored_tenant_leaving_before_its_first_turn_keeps_its_debt_in_its_tier() -> None:
    # After a restart the table has served "high" nowhere and knows no tier of it: leaving, it is
    # measured on its registration's GPUs and tier (5), not on none (debt forgotten) or tier 0
    # (whose clock another tenant's turn has taken past it).
    now = [0.0]
    policy = FairShare()
    table = LeaseTable(clock=lambda: now[0], policy=policy, max_hold=1e9)
    fairsave.restore(policy, fairsave.FairLags([fairsave.Lag("high", 5.0, 5, ("g",))]), {"high"})
    table.enqueue("low", ["g"], duty=100)
    lease = table.grant(table.pick()[0].waiter_id)
    now[0] += 10.0
    table.release(lease.lease_id)  # tier 0's clock of "g" is at 10
    table.drop_tenant("high", ["g"], 5)
    assert policy.departed == {"high": (("g",), 5)}
    table.enqueue("high", ["g"], duty=50, tier=5)
    assert policy.vtime["high"] == pytest.approx(5.0), "back where it left, not level"


def test_a_tenant_registered_on_more_gpus_than_it_asks_for_is_measured_on_those_it_asks() -> None:
    # "a" is registered on g0 and g1 but asks only for g1, where it is 5 s ahead; g0's clock is
    # far ahead (another pair of tenants there). Measured on both it would be saved 85 s behind
    # (credit); measured on g1 it is 5 s ahead, before and after the restart, and kept so even if
    # it leaves before asking again.
    now = [0.0]
    policy = FairShare()
    table = LeaseTable(clock=lambda: now[0], policy=policy, max_hold=1e9)
    policy.vclock = {clock_key("g0", 0): 100.0, clock_key("g1", 0): 10.0}
    table.enqueue("a", ["g1"], duty=50)
    table.release(table.grant(table.pick()[0].waiter_id).lease_id)
    policy.vtime["a"] = 15.0
    registered = {"a": (["g0", "g1"], 0)}

    saved = fairsave.lags_of_table(table, registered)
    assert [(lag.gpus, lag.lag) for lag in saved.tenants] == [(("g1",), pytest.approx(5.0))]

    restarted = FairShare()
    again = LeaseTable(clock=lambda: now[0], policy=restarted, max_hold=1e9)
    fairsave.restore(restarted, saved, {"a"})
    again.fair_home = {lag.tenant_id: lag.gpus for lag in saved.tenants}
    restarted.vclock[clock_key("g0", 0)] = 50.0  # g0's pair takes turns meanwhile
    assert fairsave.lags_of_table(again, registered).tenants[0].lag == pytest.approx(5.0)
    again.drop_tenant("a", ["g0", "g1"], 0)
    assert restarted.departed == {"a": (("g1",), 0)}

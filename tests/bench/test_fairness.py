"""`baton bench fairness`: the fields DESIGN.md lists, and the fair policy meeting its targets."""

from __future__ import annotations

from baton.bench.fairness import run_fairness_bench


def test_the_fair_policy_meets_its_share_and_wait_targets_where_fifo_does_not() -> None:
    out = run_fairness_bench(seconds=120.0, handoff_iterations=0)
    for key in ("tenants", "max_share_deviation", "jain_index", "starved", "p99_wait_ms"):
        assert key in out and f"reference_{key}" in out
    assert out["max_share_deviation"] <= 0.05 < out["reference_max_share_deviation"]
    assert out["starved"] == []
    assert out["p99_wait_ms"] <= out["lower_tier_turn_ms"]

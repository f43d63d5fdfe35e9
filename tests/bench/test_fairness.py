"""`baton bench fairness`: the fields DESIGN.md lists, the issue's targets, several mixes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from agent.core.fair import FairConfig
from commands.bench.fairness import MIXES, run_fairness_bench
from commands.bench.fairness_procs import GPU, Kept, Run, run_figures
from commands.bench.shares import Load, targets
from commands.cli import app


def test_the_fair_policy_meets_its_share_and_wait_targets_where_fifo_does_not() -> None:
    out = run_fairness_bench(seconds=120.0, handoff_iterations=0, mixes=["skewed"])
    for key in ("tenants", "max_share_deviation", "jain_index", "starved", "p99_wait_ms"):
        assert key in out and f"reference_{key}" in out
    for tenant in out["tenants"].values():
        assert {"entitled_share", "measured_share", "asks_its_share"} <= tenant.keys()
    assert out["max_share_deviation"] <= 0.05 < out["reference_max_share_deviation"]
    assert out["starved"] == []
    assert out["p99_wait_ms"] <= out["lower_tier_turn_ms"]
    assert out["targets"] == {
        "share_within_5_points": True,
        "no_starvation": True,
        "high_tier_wait_within_turn_plus_grace": True,
    }
    assert out["reference_targets"]["high_tier_wait_within_turn_plus_grace"] is False


def test_every_mix_is_reported_and_whether_fair_was_better_on_each() -> None:
    out = run_fairness_bench(seconds=60.0, handoff_iterations=0)
    assert list(out["mixes"]) == list(MIXES) and out["mix"] == "skewed"
    assert out["mixes"]["skewed"]["fair_better"] is True
    # Equal tenants, or two tenants, are served alike by both policies: not better there.
    assert out["mixes"]["equal"]["fair_better"] is False
    assert out["mixes"]["trainer-batch"]["fair_better"] is False
    assert out["fair_better_for_every_mix"] is False, "the default stays fifo (fairness.md)"
    for figures in out["mixes"].values():
        assert figures["starved"] == [] and figures["targets"]["no_starvation"]


def test_the_cli_takes_mixes_and_refuses_an_unknown_one() -> None:
    args = ["bench", "fairness", "--seconds", "20", "--handoff-iterations", "0", "--json"]
    args += ["--process-seconds", "0"]
    result = CliRunner().invoke(app, [*args, "--mix", "equal", "--mix", "trainer-batch"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output.strip().splitlines()[-1])
    assert list(out["mixes"]) == ["equal", "trainer-batch"] and out["mix"] == "equal"
    refused = CliRunner().invoke(app, [*args, "--mix", "nope"])
    assert refused.exit_code == 2 and "unknown mix nope" in refused.output
    refused = CliRunner().invoke(app, [*args, "--process-rounds", "0"])
    assert refused.exit_code == 2 and "--process-rounds 0 must be at least 1" in refused.output


@pytest.mark.timeout(30)  # refused before any run (accepted, a run would go on, or forever)
@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--seconds", "-1"], "--seconds -1 must be a finite number above 0"),
        (["--seconds", "inf"], "--seconds inf must be a finite number above 0"),
        (["--process-seconds", "-1"], "--process-seconds -1 must be 0 (replay only) or finite"),
        (["--handoff-iterations", "-1"], "--handoff-iterations -1 must be 0 (skip) or more"),
        (
            ["--seconds", "0.001"],
            "--seconds 0.001 is shorter than the longest turn of mix long-turns (1 s): no turn "
            "might end in the replay; give 1 or more",
        ),
        (
            ["--seconds", "0.1", "--mix", "equal", "--mix", "tenfold"],
            "--seconds 0.1 is shorter than the longest turn of mix equal (0.3 s)",
        ),
    ],
)
def test_the_cli_refuses_a_bad_number_before_any_run(flags: list[str], says: str) -> None:
    refused = CliRunner().invoke(app, ["bench", "fairness", *flags], terminal_width=200)
    assert refused.exit_code == 2 and says in refused.output, refused.output


def test_a_replay_as_long_as_the_longest_turn_is_measured() -> None:
    for name, mix in MIXES.items():
        turn = max(load.turn for load in mix.values())
        figures = run_fairness_bench(turn, 0, mixes=[name], process_seconds=0)
        assert figures["mix"] == name and figures["seconds"] == turn


def test_the_replay_orders_events_as_a_client_sees_them() -> None:
    # A yielder asks again only after its yield is answered: without anticipation the next turn
    # goes to whoever waits, and no share above one half is reachable (the figures).
    mixes = ["duty-above-half", "tenfold"]
    blind = run_fairness_bench(60.0, 0, FairConfig(anticipate_s=0.0), mixes)["mixes"]
    shares = {n: t["measured_share"] for n, t in blind["duty-above-half"]["tenants"].items()}
    assert shares == pytest.approx({"large": 0.5, "medium": 0.375, "small": 0.125}, abs=0.01)
    assert blind["tenfold"]["tenants"]["short"]["measured_share"] < 0.1
    out = run_fairness_bench(60.0, 0, FairConfig(), mixes)["mixes"]
    for figures in out.values():
        assert figures["max_share_deviation"] <= 0.05 < figures["reference_max_share_deviation"]
        assert figures["fair_better"]


def test_the_process_level_run_reports_shares_by_both_clocks() -> None:
    out = run_fairness_bench(10.0, 0, mixes=["tenfold"], process_seconds=2.0)
    run = out["mixes"]["tenfold"]["process"]
    for key in ("max_share_deviation", "idle_while_waiting", "handoff_p50_ms", "tenants"):
        assert key in run and f"reference_{key}" in run
    assert "turns" not in run
    for tenant in run["tenants"].values():
        assert tenant["tenant_gpu_seconds"] > 0 and tenant["agent_gpu_seconds"] > 0
        assert tenant["away_ms"] > 0
    # The short-turn tenant is owed the GPU over the long one: it keeps its lease across turns.
    assert run["tenants"]["short"]["kept_gap_seconds"] > 0
    assert run["reference_tenants"]["short"]["kept_gap_seconds"] == 0  # FIFO: never kept
    assert {"share_within_5_points", "idle_while_waiting_within_2pct"} <= run["targets"].keys()
    assert out["process_seconds"] == 2.0 and "process_fair_better_for_every_mix" in out


def test_a_kept_leases_gaps_count_as_its_tenants_and_once() -> None:
    kept = Kept()
    for lease, granted, yielded in [("l1", 0.0, 1.0), ("l1", 1.5, 2.0), ("l2", 3.0, 4.0)]:
        kept.turn(lease, granted, yielded)
    assert kept.seconds == 0.5  # l1's gap, not the handover to l2
    turns = {"a": [(0.0, 0.0, 1.0), (1.5, 1.5, 2.0)], "b": [(0.5, 2.01, 3.0)]}
    accounting = {(GPU, "local/a"): 2.0, (GPU, "local/b"): 1.0}  # a's lease: 0 to 2 s
    mix = {"a": Load(duty=50, turn=0.5), "b": Load(duty=50, turn=1.0)}
    out = run_figures(mix, [Run(turns, {"a": 0.5, "b": 0.0}, 0.0, 3.0, accounting)], 0.01)
    assert out["tenants"]["a"]["kept_gap_seconds"] == 0.5
    assert out["accounting_error"] == pytest.approx(0.01, abs=1e-3)  # b's 10 ms, not a's gap
    assert out["tenants"]["a"]["away_ms"] == pytest.approx(500.0)  # the gap once, not twice


def test_runs_taken_together_add_up_their_spans_and_pool_their_handoffs() -> None:
    mix = {"a": Load(duty=50, turn=0.1), "b": Load(duty=50, turn=0.3)}
    first = {"a": [(0.0, 0.0, 0.1), (0.1, 0.4, 0.5)], "b": [(0.05, 0.101, 0.4)]}
    later = {n: [(r + 10, g + 10, y + 10) for r, g, y in ts] for n, ts in first.items()}
    later["b"].append((10.6, 10.6, 10.9))  # asked after the others stopped: no handoff
    accounting = {(GPU, "local/a"): 0.2, (GPU, "local/b"): 0.3}
    one = run_figures(mix, [Run(first, {"a": 0.0, "b": 0.0}, 0.0, 0.5, accounting)], 0.01)
    runs = [
        Run(first, {"a": 0.0, "b": 0.0}, 0.0, 0.5, accounting),
        Run(later, {"a": 0.0, "b": 0.0}, 10.0, 11.0, accounting | {(GPU, "local/b"): 0.6}),
    ]
    both = run_figures(mix, runs, 0.01)
    assert one["handoffs"] == 2 and both["handoffs"] == 4  # not the step from one run to the next
    assert both["handoff_p50_ms"] == pytest.approx(one["handoff_p50_ms"])
    assert both["seconds"] == pytest.approx(1.5)
    shares = {n: t["measured_share"] for n, t in both["tenants"].items()}
    assert shares == pytest.approx({"a": 0.4 / 1.5, "b": 0.898 / 1.5}, abs=1e-3)
    assert both["tenants"]["b"]["agent_gpu_seconds"] == pytest.approx(0.9)
    assert both["idle_while_waiting"] == pytest.approx(0.002 / 1.5, abs=1e-4)
    assert len(both["turns"]["b"]) == 3
    # Each tenant's handoffs: those that passed the turn to it.
    assert both["tenants"]["b"]["handoff_p50_ms"] == pytest.approx(1.0)
    assert both["tenants"]["a"]["handoff_p50_ms"] == pytest.approx(0.0)


def test_the_high_tiers_wait_is_judged_against_a_lower_turn_as_held_and_one_handover() -> None:
    mix = {"trainer": Load(duty=50, turn=0.1, gap=0.4, tier=1000), "batch": Load(duty=50, turn=0.5)}
    accounting = {(GPU, "local/trainer"): 0.1, (GPU, "local/batch"): 1.002}

    def judged(granted: float) -> dict[str, Any]:
        """The trainer asks as the batch turn starts and is granted at `granted`; the batch
        tenant, waiting meanwhile, 1.5 ms after the trainer's turn."""
        batch = [(0.0, 0.0, 0.502), (0.51, granted + 0.1015, granted + 0.6015)]
        turns = {"trainer": [(0.0005, granted, granted + 0.1)], "batch": batch}
        run = Run(turns, {"trainer": 0.0, "batch": 0.0}, 0.0, 1.2, accounting)
        return run_figures(mix, [run], 0.01)

    out = judged(0.5035)  # its wait: the batch turn as held (502 ms) and a handover (1.5 ms)
    assert out["lower_tier_turn_ms"] == pytest.approx(502.0)
    assert out["handover_allowance_ms"] == pytest.approx(1.5)
    assert out["p99_wait_ms"] == pytest.approx(503.0)
    assert targets(out, None)["high_tier_wait_within_turn_plus_grace"]
    slow = judged(0.56)  # a 58 ms handover to the trainer excuses nothing
    assert slow["handover_allowance_ms"] == pytest.approx(1.5)
    assert not targets(slow, None)["high_tier_wait_within_turn_plus_grace"]

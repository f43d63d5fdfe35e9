"""`baton bench train`'s handover figures from turn and callback records (no processes)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from commands.bench.handovers import handovers, summary


def report(turns: list[list[float]], callbacks: list[list[object]]) -> dict:
    return {"turns": [["lease", *t] for t in turns], "callbacks": callbacks}


def test_a_handover_is_a_switch_to_a_tenant_that_already_waited() -> None:
    a = report([[0.0, 0.0, 1.0], [1.5, 2.010, 3.0]], [])
    b = report([[0.5, 1.010, 2.0], [2.5, 3.5, 4.0]], [])
    found = handovers([a, b], 0.0, 10.0)
    # a -> b at 1.0 -> 1.010 (b asked at 0.5), b -> a at 2.0 -> 2.010 (a asked at 1.5);
    # a -> b at 3.0 -> 3.5 counts (b asked at 2.5, before a yielded).
    assert [(h.start, h.end) for h in found] == [(1.0, 1.010), (2.0, 2.010), (3.0, 3.5)]


def test_the_parts_of_a_handover_add_up_to_its_idle_time() -> None:
    # a yields at 1.000; the agent parks a (read 1.002, runs 1.0025-1.0045, answered 1.005),
    # restores b (read 1.007, runs 1.0072-1.0082, answered 1.0085); b is granted at 1.010.
    a = report([[0.0, 0.0, 1.0]], [["park", 1.002, 1.0025, 1.0045, 1.005, 100]])
    b = report([[0.5, 1.010, 2.0]], [["restore", 1.007, 1.0072, 1.0082, 1.0085, 100]])
    agent_moves = {
        "park": {"count": 1.0, "timed": 1.0, "seconds": 0.004, "bytes": 100.0},
        "restore": {"count": 1.0, "timed": 1.0, "seconds": 0.002, "bytes": 100.0},
    }
    figures = summary([a, b], agent_moves, 0.0, 10.0)
    assert figures["handovers"] == 1 and figures["idle_per_handover_p50_ms"] == 10.0
    parts = figures["idle_per_handover_ms"]
    assert parts["moves"] == pytest.approx(2.0 + 1.0)
    # read to run and run to answer, park then restore
    assert parts["client"] == pytest.approx(0.5 + 0.5 + 0.2 + 0.3)
    # the agent's 4 and 2 ms for the moves less the tenants' 3 and 1.5 ms read to answer
    assert parts["transit"] == pytest.approx(1.0 + 0.5)
    assert parts["agent"] == pytest.approx(10.0 - 3.0 - 1.5 - 1.5)


def test_a_restore_made_with_the_grant_is_a_move_with_no_transit() -> None:
    # a yields at 1.000; the agent parks a (as above) and grants b, which restores itself as the
    # grant arrives (1.0060-1.0070, no message of its own) and returns from acquire at 1.0072.
    a = report([[0.0, 0.0, 1.0]], [["park", 1.002, 1.0025, 1.0045, 1.005, 100]])
    b = report([[0.5, 1.0072, 2.0]], [["restore", 1.006, 1.006, 1.007, 1.007, 100]])
    agent_moves = {
        "park": {"count": 1.0, "timed": 1.0, "seconds": 0.004, "bytes": 100.0},
        "restore": {"count": 2.0, "timed": 1.0, "seconds": 0.002, "bytes": 200.0},
    }  # another restore, asked by callback, took the agent 2 ms: none of it is transit here
    parts = summary([a, b], agent_moves, 0.0, 10.0)["idle_per_handover_ms"]
    assert parts["idle"] == pytest.approx(7.2)
    assert parts["moves"] == pytest.approx(2.0 + 1.0)
    assert parts["client"] == pytest.approx(0.5 + 0.5)  # the park's only
    assert parts["transit"] == pytest.approx(1.0)  # the park's only
    assert parts["agent"] == pytest.approx(7.2 - 3.0 - 1.0 - 1.0)


def test_the_short_mix_is_four_short_steppers_on_a_gpu_that_holds_one() -> None:
    from commands.demo.trl import SHORT_STEPS, trl_mix

    mix = trl_mix("short", steps=5, tenants=None)
    assert (mix.tenants, mix.steps, mix.fits) == (4, 5, 1) and mix == replace(SHORT_STEPS, steps=5)
    assert all(s.config.off_s == 0 for s in mix.specs())
    with pytest.raises(ValueError, match="--mix 'long'"):
        trl_mix("long")
    with pytest.raises(ValueError, match=r"--grpo-batch 6: .* multiple of the 4"):
        trl_mix("short", grpo_batch=6)
    with pytest.raises(ValueError, match="--d-model 10: a multiple of 4"):
        trl_mix("default", hidden=10)


def test_bench_train_takes_a_mix_with_the_trl_framework_only() -> None:
    from typer.testing import CliRunner

    from commands.cli import app

    result = CliRunner().invoke(app, ["bench", "train", "--mix", "short"])
    assert result.exit_code != 0 and "--framework trl only" in result.output


def test_bench_train_gives_the_trl_mix_the_sizes_asked_and_refuses_those_it_has_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("trl", reason="needs trl")
    from typer.testing import CliRunner

    import commands.bench.train
    from commands.cli import app
    from commands.demo.trl import SHORT_STEPS

    ran: list[object] = []

    def run(config: object) -> dict:
        ran.append(config)
        return {}

    monkeypatch.setattr(commands.bench.train, "run", run)
    sizes = ["--sft-batch", "96", "--grpo-batch", "12", "--d-model", "80"]
    result = CliRunner().invoke(
        app, ["bench", "train", "--framework", "trl", "--mix", "short", *sizes]
    )
    assert result.exit_code == 0, result.output
    assert ran == [replace(SHORT_STEPS, sft_batch=96, grpo_batch=12, hidden=80)]
    for torch_only in (["--layers", "3"], ["--group", "2"]):
        result = CliRunner().invoke(app, ["bench", "train", "--framework", "trl", *torch_only])
        assert result.exit_code != 0 and "--framework torch only" in result.output
    assert len(ran) == 1


def test_bench_train_refuses_tenants_that_all_fit_together_before_any_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("torch", reason="needs torch")
    from typer.testing import CliRunner

    import commands.bench.train
    from commands.cli import app

    async def run_alone(specs: object) -> list[dict]:
        raise AssertionError("the tenants ran alone before their sizes were refused")

    monkeypatch.setattr(commands.bench.train, "run_alone", run_alone)
    sizes = ["--d-model", "8", "--layers", "1", "--sft-batch", "1", "--grpo-batch", "1"]
    result = CliRunner().invoke(app, ["bench", "train", "--tenants", "2", "--steps", "2", *sizes])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("baton bench train: 2 tenants of ")
    assert result.output.endswith(
        "so fewer would be parked; make them larger (--d-model, --sft-batch, --grpo-batch) or "
        "more alike\n"
    )

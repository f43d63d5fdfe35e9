"""`baton bench handoff`: the gap arithmetic, and a short real run with each client."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from commands.bench.handoff import (
    MAX_HOLD_MS,
    handoffs,
    idle_share,
    percentile,
    run_handoff_bench,
)
from commands.cli import app

FIELDS = (
    "acquire_p50_ms",
    "acquire_p99_ms",
    "acquire_samples",
    "handoff_p50_ms",
    "handoff_p99_ms",
    "handoff_samples",
    "iterations",
    "reference_acquire_p99_ms",
    "reference_acquire_samples",
    "reference_handoff_p50_ms",
    "reference_handoff_p99_ms",
    "reference_handoff_samples",
)
"""Every row's p99 comes with its sample count: over fewer than 100 it is the largest."""


def test_a_gap_counts_only_when_the_turn_passes_to_a_queued_tenant() -> None:
    records = [
        [1, "ping", 0.0, 0.001, 0.010],
        [2, "pong", 0.005, 0.0115, 0.020],  # queued before ping yielded: 1.5 ms gap
        [3, "pong", 0.021, 0.022, 0.030],  # same tenant again: no handoff
        [4, "ping", 0.031, 0.032, 0.040],  # asked after pong yielded: not a handoff
    ]
    assert handoffs(records) == pytest.approx([0.0015])


def test_the_idle_share_is_the_gaps_while_someone_waited_over_the_run() -> None:
    records = [
        [1, "ping", 0.0, 0.0, 0.010],
        [2, "pong", 0.005, 0.011, 0.020],  # waited: 1 ms idle
        [3, "ping", 0.012, 0.022, 0.030],  # waited: 2 ms idle
        [4, "pong", 0.035, 0.036, 0.040],  # asked after the GPU was free: not counted
    ]
    assert idle_share(records) == pytest.approx(0.003 / 0.040)
    assert idle_share([]) == 0.0


def test_percentile_is_nearest_rank() -> None:
    samples = [float(x) for x in range(1, 101)]
    assert percentile(samples, 0.5) == 51.0
    assert percentile(samples, 0.99) == 100.0


@pytest.mark.parametrize(
    ("client", "transport"), [("blocking", "direct"), ("async", "direct"), ("async", "grpc")]
)
def test_a_short_run_reports_every_field(client: str, transport: str) -> None:
    figures = run_handoff_bench(30, client, transport)
    assert all(figures[f] > 0 for f in FIELDS)
    assert figures["acquire_p50_ms"] <= figures["acquire_p99_ms"]
    assert figures["handoff_p50_ms"] <= figures["handoff_p99_ms"]
    assert figures["acquire_samples"] == figures["reference_acquire_samples"] == 30
    assert (figures["client"], figures["transport"]) == (client, transport)


@pytest.mark.parametrize(("backend", "swap"), [("fake", False), ("app", False), ("app", True)])
def test_a_parking_backend_is_measured_beside_the_agent_without_one(
    backend: str, swap: bool
) -> None:
    figures = run_handoff_bench(20, backend=backend, hold_ms=1.0, tenants=3, swap=swap)
    assert (figures["backend"], figures["tenants"], figures["swap"]) == (backend, 3, swap)
    for prefix in ("", "reference_agent_", "reference_"):
        assert figures[f"{prefix}handoff_p50_ms"] > 0
        assert figures[f"{prefix}handoff_samples"] > 0
        assert 0 < figures[f"{prefix}idle_share"] < 1


@pytest.mark.parametrize(
    ("options", "refusal"),
    [
        ({"backend": "tape"}, "'tape' is not one of none, fake, cuda, app$"),
        ({"tenants": 1}, "a handoff needs 2 or more"),
        ({"tenants": 65}, "tenants 65 is too many: at most 64"),
        ({"swap": True}, "swap runs on the simulated GPU"),
        ({"hold_ms": -1.0}, "hold-ms -1 is negative"),
        ({"hold_ms": float("nan")}, "hold-ms nan is not a number of milliseconds"),
        ({"hold_ms": float("inf")}, "hold-ms inf is not a number of milliseconds"),
        ({"hold_ms": 1e300}, "hold-ms 1e\\+300 is too long: at most 500 ms a turn"),
    ],
)
def test_a_setup_that_cannot_run_is_refused_by_name(options: dict, refusal: str) -> None:
    with pytest.raises(ValueError, match=refusal):
        run_handoff_bench(5, **options)


@pytest.mark.parametrize(
    ("args", "flag", "says"),
    [
        (["--iterations", "0"], "'--iterations'", "greater than or equal to 1"),
        (["--rounds", "0"], "'--rounds'", "greater than or equal to 1"),
        (["--hold-ms", "nan"], "--hold-ms", "not a number of milliseconds"),
        (["--api", "llmd", "--backend", "fake"], "--backend", "applies to --api baton only"),
        (["--api", "llmd", "--swap"], "--swap", "applies to --api baton only"),
        (["--tenants", "65", "--iterations", "1", "--rounds", "1"], "--tenants", "at most 64"),
        (["--tenants", "100000"], "--tenants", "tenants 100000 is too many: at most 64"),
        (["--hold-ms", "1e300"], "--hold-ms", "is too long: at most 500 ms"),
    ],
)
def test_the_command_refuses_an_option_it_cannot_use_before_any_run(
    args: list[str], flag: str, says: str
) -> None:
    result = CliRunner().invoke(app, ["bench", "handoff", *args], terminal_width=200)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for {flag}" in result.output and says in result.output


def test_the_hold_ms_help_states_its_limit() -> None:
    group = typer.main.get_command(app)
    assert isinstance(group, typer.main.TyperGroup)
    bench = group.commands["bench"]
    assert isinstance(bench, typer.main.TyperGroup)
    hold = next(p for p in bench.commands["handoff"].params if "--hold-ms" in p.opts)
    assert f"at most {MAX_HOLD_MS:g}" in str(getattr(hold, "help", ""))


def test_the_blocking_client_over_grpc_is_refused_with_the_way_out() -> None:
    with pytest.raises(ValueError, match="direct sessions only; use --client async"):
        run_handoff_bench(5, "blocking", "grpc")


def test_an_unknown_transport_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'carrier-pigeon' is not one of direct, grpc"):
        run_handoff_bench(5, "blocking", "carrier-pigeon")


def test_an_unknown_client_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'threads' is not one of blocking, async"):
        run_handoff_bench(5, "threads")


def test_the_command_prints_the_figures_as_json_on_its_last_line() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from commands.cli import main; main()",
            "bench",
            "handoff",
            "--iterations",
            "20",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    figures = json.loads(out.strip().splitlines()[-1])
    assert set(FIELDS) <= set(figures)


def test_the_command_refuses_an_unknown_backend_naming_the_option() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from commands.cli import main; main()",
            "bench",
            "handoff",
            "--backend",
            "tape",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--backend" in done.stderr and "'tape' is not one of" in done.stderr


@pytest.mark.parametrize(("api", "who"), [("baton", "tenants"), ("llmd", "jobs")])
def test_a_run_too_short_to_see_a_handoff_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch, api: str, who: str
) -> None:
    """A turn each: the tenants may well never ask while another holds the turn (here they are
    made to: no gap counts as a handoff)."""
    import commands.bench.handoff
    import commands.bench.llmd_handoff

    for module in (commands.bench.handoff, commands.bench.llmd_handoff):
        monkeypatch.setattr(module, "handoffs", lambda records: [])
    result = CliRunner().invoke(app, ["bench", "handoff", "--api", api, "--iterations", "1"])
    assert result.exit_code == 1, result.output
    assert result.output == (
        f"baton bench handoff: no handoff seen in 1 turn of each of the {who}: none asked while "
        "another held the turn; give more --iterations\n"
    )


def test_tenants_that_outlast_the_wait_end_the_run_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tenants get the time their turns are held and `TENANT_WAIT_S` beyond it (here none:
    the run cannot finish in the time its turns sleep alone); past it, one line, no traceback."""
    import commands.bench.handoff

    monkeypatch.setattr(commands.bench.handoff, "TENANT_WAIT_S", 0.0)
    args = ["bench", "handoff", "--iterations", "1", "--rounds", "1", "--hold-ms", "10"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    assert result.output == (
        "baton bench handoff: bench tenants (commands.bench.handoff_tenant) did not finish "
        "within 0 s\n"
    )

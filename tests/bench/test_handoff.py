"""`baton bench handoff`: the gap arithmetic, and a short real run with each client."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from baton.bench.handoff import handoffs, percentile, run_handoff_bench

FIELDS = (
    "acquire_p50_ms",
    "acquire_p99_ms",
    "handoff_p50_ms",
    "handoff_p99_ms",
    "iterations",
    "reference_acquire_p99_ms",
    "reference_handoff_p50_ms",
    "reference_handoff_p99_ms",
)


def test_a_gap_counts_only_when_the_turn_passes_to_a_queued_tenant() -> None:
    records = [
        [1, "ping", 0.0, 0.001, 0.010],
        [2, "pong", 0.005, 0.0115, 0.020],  # queued before ping yielded: 1.5 ms gap
        [3, "pong", 0.021, 0.022, 0.030],  # same tenant again: no handoff
        [4, "ping", 0.031, 0.032, 0.040],  # asked after pong yielded: not a handoff
    ]
    assert handoffs(records) == pytest.approx([0.0015])


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
    assert figures["handoff_samples"] > 0
    assert (figures["client"], figures["transport"]) == (client, transport)


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
            "from baton.cli import main; main()",
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

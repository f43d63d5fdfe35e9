"""`baton bench handoff --api llmd`: a short real run through llm-d's Acquire and Yield."""

from __future__ import annotations

import json
import subprocess
import sys

from commands.bench.llmd_handoff import run_llmd_handoff_bench
from tests.bench.test_handoff import FIELDS


def test_a_short_run_reports_every_field_with_the_relay_beside_it() -> None:
    figures = run_llmd_handoff_bench(20)
    assert figures["api"] == "llmd"
    assert all(figures[f] > 0 for f in FIELDS)
    assert figures["acquire_p50_ms"] <= figures["acquire_p99_ms"]
    assert figures["handoff_p50_ms"] <= figures["handoff_p99_ms"]
    assert figures["acquire_samples"] == figures["reference_acquire_samples"] == 20
    assert figures["acquire_p99_ms"] < 1000, "no 1 s polling: a turn comes when it is free"


def test_the_command_takes_api_llmd_and_refuses_other_apis() -> None:
    base = [sys.executable, "-c", "from commands.cli import main; main()", "bench", "handoff"]
    out = subprocess.run(
        [*base, "--api", "llmd", "--iterations", "10", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1])["api"] == "llmd"
    bad = subprocess.run([*base, "--api", "slurm"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "choose baton or llmd" in bad.stderr

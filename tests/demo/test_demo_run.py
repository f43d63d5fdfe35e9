"""A short demo run: tenant processes over the real socket, checked against the agent's events."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from PIL import Image
from rich.console import Console

from agent.core import events as ev
from baton.contract.names import MIB
from commands.demo.report import print_report, summarize
from commands.demo.runner import DemoConfig, PhaseResult, run_comparison
from commands.demo.timeline import chrome_trace, png_size, write_timeline

# Two 600 MiB tenants on a 1000 MiB GPU: they never fit together, so every switch moves memory.
CONFIG = DemoConfig(
    tenants=2,
    duty=0.3,
    cycle_s=0.4,
    duration_s=2.0,
    warmup_s=0.5,
    gpu_memory_mib=1000,
    footprints_mib=(600,),
    pcie_gbps=55.0,
    scale=1 / 1024,
)
BENCH_FIELDS = {
    "tenants", "tenant_duty", "ideal_duty", "baseline_duty", "timesliced_duty", "efficiency",
    "switches", "moved_bytes", "integrity_ok",
}  # fmt: skip


@pytest.fixture(scope="module")
def run() -> tuple[PhaseResult, PhaseResult]:
    return asyncio.run(asyncio.wait_for(run_comparison(CONFIG), 90))


def grants(phase: PhaseResult) -> list[ev.Event]:
    return [e for e in phase.events if e.kind == ev.GRANTED]


def test_switches_and_duty_agree_with_the_agents_events_and_busy_counter(run):
    alone, shared = run
    s = summarize(CONFIG, alone, shared)
    in_window = [e for e in grants(shared) if shared.t0 <= e.at <= shared.t1]
    holders = [e.tenant_id for e in grants(shared)]
    changes = {i for i in range(1, len(holders)) if holders[i] != holders[i - 1]}
    assert s["switches"] == sum(1 for i in changes if grants(shared)[i] in in_window)
    assert s["switches"] >= 2
    for phase in (alone, shared):
        for gpu in phase.gpus:
            assert 0 < phase.duty(gpu) <= 1
            whole = sum(h.end - h.start for h in phase.holds if h.gpu == gpu)
            assert whole == pytest.approx(phase.agent_busy_s[gpu], abs=0.05)
    assert 0 < s["timesliced_duty"] <= 1 and 0 < s["baseline_duty"] <= 1
    assert s["ideal_duty"] == pytest.approx(min(1.0, 2 * s["tenant_duty"]), abs=1e-3)


def test_every_switch_moved_memory_and_every_turn_verified_its_data(run):
    alone, shared = run
    s = summarize(CONFIG, alone, shared)
    assert s["integrity_ok"] is True
    assert alone.moves["park"]["count"] == 0
    assert s["parks"] >= s["switches"] - 1 >= 1
    assert s["moved_bytes"] == (s["parks"] + s["restores"]) * 600 * MIB
    for phase in (alone, shared):
        agent_leases = {e.lease_id: e.tenant_id for e in grants(phase)}
        for tenant in phase.tenants:
            leases = [turn[0] for turn in tenant.turns]
            assert all(agent_leases[lease] == tenant.tenant_id for lease in leases)
            assert tenant.steps == len(leases) == tenant.verified + 1


def test_the_report_prints_the_summarised_figures(run):
    alone, shared = run
    console = Console(record=True, width=160)
    s = print_report(console, CONFIG, alone, shared)
    text = console.export_text()
    assert f"{s['timesliced_duty'] * 100:.1f}%" in text
    assert f"{s['efficiency'] * 100:.1f}%" in text
    assert "intact" in text and "t1" in text and "t2" in text


def test_timeline_is_a_chrome_trace_and_a_png_of_the_right_size(run, tmp_path):
    alone, shared = run
    png, trace = write_timeline(tmp_path, [alone, shared], "test")
    document = json.loads(trace.read_text())
    assert document == chrome_trace([alone, shared])
    slices = [e for e in document["traceEvents"] if e["ph"] == "X"]
    names = {e["args"]["name"] for e in document["traceEvents"] if e["ph"] == "M"}
    assert {"GPU-fake-0000", "GPU-fake-0001"} <= names
    for e in slices:
        assert {"name", "ts", "dur", "pid", "tid"} <= e.keys() and e["dur"] >= 0 and e["ts"] >= 0
    turns = [e for e in slices if e["pid"] == 2 and e["cat"] == "turn"]
    assert len(turns) == sum(1 for h in shared.holds if h.start < shared.t1 and h.end > shared.t0)
    waits = [e for e in slices if e["pid"] == 2 and e["cat"] == "wait"]
    waited_s = summarize(CONFIG, alone, shared)["idle_while_waited_s"]
    assert sum(e["dur"] for e in waits) / 1e6 == pytest.approx(waited_s, abs=0.01)
    with Image.open(png) as image:
        assert image.format == "PNG"
        assert image.size == png_size(len(alone.gpus) + len(shared.gpus))


def test_bench_duty_prints_every_field_on_its_last_line():
    out = subprocess.run(
        [sys.executable, "-c", "from commands.cli import main; main()", "bench", "duty", "--json",
         "--tenants", "2", "--duration", "1.0", "--warmup", "0.2", "--cycle", "0.3",
         "--gpu-memory", "1000", "--footprints", "600", "--scale", "0.001"],
        capture_output=True, text=True, timeout=90, check=True,
    )  # fmt: skip
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result.keys() >= BENCH_FIELDS
    assert result["tenants"] == 2 and result["integrity_ok"] is True
    assert result["moved_bytes"] > 0 and result["switches"] >= 1

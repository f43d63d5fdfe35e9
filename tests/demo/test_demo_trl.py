"""`baton demo --tenant-kind trl`: TRL SFT and GRPO jobs alone, then sharing a GPU too small for
both, run to the demo's deadline (`--steps 0`) and parked by the app backend."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest
from rich.console import Console

from agent.core import events as ev
from commands.cli.demo import _config, _train
from commands.demo.report import print_report, summarize
from commands.demo.runner import DemoConfig, PhaseResult, run_comparison

if importlib.util.find_spec("torch") is None or importlib.util.find_spec("trl") is None:
    pytest.skip("needs trl (pip install 'baton-gpu[trl]')", allow_module_level=True)


@pytest.fixture(scope="module")
def run() -> tuple[DemoConfig, PhaseResult, PhaseResult]:
    flags = (2, 0.4, 1.5, 3.0, 1.0, 16384, "6144", 55.0, 1 / 4096, 0.1, 7)
    config = _train(_config(*flags), "trl")  # as `baton demo --tenant-kind trl --tenants 2`
    alone, shared = asyncio.run(asyncio.wait_for(run_comparison(config), 400))
    return config, alone, shared


@pytest.mark.timeout(420)
def test_trl_tenants_train_to_the_deadline_alone_and_then_sharing_with_parks(run):
    config, alone, shared = run
    assert config.backend == "app"
    assert "agent.examples.trl_train.tenant" in config.command(0)
    assert config.command(0)[config.command(0).index("--steps") + 1] == "0"
    for phase in (alone, shared):
        agent_leases = {e.lease_id: e.tenant_id for e in phase.events if e.kind == ev.GRANTED}
        for tenant in phase.tenants:
            assert not tenant.error, tenant.error
            assert tenant.steps >= 1 and tenant.turns
            assert all(agent_leases[turn[0]] == tenant.tenant_id for turn in tenant.turns)
            assert tenant.verified == tenant.steps - 1 and not tenant.mismatches
    assert alone.moves["park"]["count"] == 0
    assert shared.moves["park"]["count"] >= 1 and shared.moves["park"]["bytes"] > 0
    assert summarize(config, alone, shared)["integrity_ok"] is True


def test_the_report_prints_for_trl_tenants(run):
    config, alone, shared = run
    console = Console(record=True, width=120)
    print_report(console, config, alone, shared)
    text = console.export_text()
    assert "intact" in text and "CORRUPTED" not in text

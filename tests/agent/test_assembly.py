"""The agent's composition root: one config builds every part, wired at construction."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agent.assembly import AgentConfig
from agent.core import events as ev
from agent.node.tenants import POD, Tenant
from agent.parking.backends.base import BackendError
from agent.parking.preparer import ParkingPreparer
from agent.parking.setup import ParkingOptions, parse_fake_gpus
from agent.server.service import tenant_ref
from baton.contract.names import MIB
from commands.cli import app
from tests.harness.agent import AgentRunner

GPUS = parse_fake_gpus("1x100")
GPU = next(iter(GPUS))


@pytest.fixture
def fake_agent(workdir: str) -> Iterator[AgentRunner]:
    parking = ParkingOptions(backend="fake", fake_gpus="1x100", fake_dir=f"{workdir}/gpus")
    runner = AgentRunner(workdir, parking=parking).start()
    yield runner
    runner.stop()


def test_tenant_ref_carries_what_backends_need() -> None:
    tenant = Tenant(
        "ns/p", "p", ("GPU-a",), gpu_memory_mib=10, memory_limit_bytes=0, pids={7, 3}, pod_uid="u"
    )
    ref = tenant_ref(tenant)
    assert ref.pids == (3, 7) and ref.declared_bytes == 10 * MIB
    assert ref.memory_limit_bytes is None and ref.pod_uid == "u"


def test_the_preparer_reads_the_services_tenants_and_tells_it_of_quarantines(
    fake_agent: AgentRunner,
) -> None:
    parking = fake_agent.agent.parking
    assert isinstance(parking, ParkingPreparer) and parking.gpu_memory == GPUS

    async def join_and_quarantine() -> tuple[str, ...]:
        fake_agent.service.upsert_pod(Tenant("ns/p", "p", (GPU,), source=POD, pod_uid="u"))
        counted = tuple(await asyncio.to_thread(parking._tenant_ids))
        parking.quarantines.note("ns/p", "stuck in the driver")
        return counted

    assert fake_agent.call(join_and_quarantine()) == ("ns/p",)
    told = fake_agent.wait_event(lambda e: e.kind == ev.QUARANTINED)
    assert told.tenant_id == "ns/p" and told.detail == "stuck in the driver"


def test_parking_metrics_are_served_with_the_agents(fake_agent: AgentRunner) -> None:
    code, body = fake_agent.http("/metrics")
    assert code == 200 and "baton_host_memory_budget_bytes" in body


def test_the_app_backend_reaches_tenants_through_the_agents_sessions(workdir: str) -> None:
    parking = ParkingOptions(backend="app", fake_gpus="1x100")
    with AgentRunner(workdir, parking=parking) as runner:
        built = runner.agent.parking
        assert isinstance(built, ParkingPreparer) and built.backend.name == "app"

        async def park() -> str:
            try:
                await asyncio.to_thread(built.backend.park, "ns/p", GPU)
            except BackendError as e:
                return str(e)
            return ""

        assert "has no session with an on_park callback" in runner.call(park())


def _configs(monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str]) -> Any:
    seen: list[AgentConfig] = []

    async def capture(config: AgentConfig, early: object = None) -> None:
        seen.append(config)

    monkeypatch.setattr("agent.assembly.run_agent", capture)
    for name in ("BATON_AGENT_POLICY", "BATON_AGENT_QUEUE_POLICY"):
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(app, ["agent", *args], env=env)
    return result, seen


def test_queue_policy_has_a_flag_and_env_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    result, seen = _configs(monkeypatch, ["--queue-policy", "lrs"], {})
    assert result.exit_code == 0 and seen[0].queue_policy == "lrs"
    assert "deprecated" not in result.output
    result, seen = _configs(monkeypatch, [], {"BATON_AGENT_QUEUE_POLICY": "lrs"})
    assert result.exit_code == 0 and seen[0].queue_policy == "lrs"
    result, seen = _configs(monkeypatch, [], {})
    assert result.exit_code == 0 and seen[0].queue_policy == "fair"


def test_the_old_policy_flag_still_works_and_says_it_is_deprecated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for args, env in (["--policy", "lrs"], {}), ([], {"BATON_AGENT_POLICY": "lrs"}):
        result, seen = _configs(monkeypatch, args, env)
        assert result.exit_code == 0 and seen[0].queue_policy == "lrs"
        warnings = [line for line in result.output.splitlines() if "deprecated" in line]
        assert len(warnings) == 1 and "--queue-policy" in warnings[0]


def test_an_unknown_queue_policy_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    result, seen = _configs(monkeypatch, ["--queue-policy", "random"], {})
    assert result.exit_code == 2 and "unknown policy 'random'" in result.output and not seen


def test_the_host_memory_budget_takes_a_share_of_memtotal_as_the_node_daemons_do(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`BATON_HOST_MEMORY_BUDGET=40%`, which the device plugin and the DRA driver take (and
    publish for the extender), stopped the agent reading the same variable: exit 2, 'Input
    should be a valid integer'."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:        1048576 kB\nMemAvailable:     524288 kB\n")
    monkeypatch.setattr("baton.contract.meminfo.MEMINFO", str(meminfo))
    for given, mib in (("40%", 409), (" 100% ", 1024), ("65536", 65536), ("0", 0)):
        result, seen = _configs(monkeypatch, [], {"BATON_HOST_MEMORY_BUDGET": given})
        assert result.exit_code == 0, result.output
        assert seen[0].parking.host_memory_budget_mib == mib, given
    for given, said in (("150%", "the share must be within (0, 100]%"), ("-5", "0 or more")):
        result, seen = _configs(monkeypatch, ["--host-memory-budget", given], {})
        shown = " ".join(result.output.replace("│", " ").split())
        assert result.exit_code == 2 and not seen, shown
        assert f"Invalid value: --host-memory-budget {given!r}: " in shown and said in shown

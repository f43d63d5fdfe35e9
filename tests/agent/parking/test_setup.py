"""Building the preparer from the agent's flags, and the evacuate bench's report."""

from __future__ import annotations

import asyncio

import pytest

from agent.core.residency import NullPreparer
from agent.parking.backends import cuda as cuda_mod
from agent.parking.backends.app import PARKED_HEADROOM
from agent.parking.backends.base import BackendUnavailable
from agent.parking.backends.fake import FakeBackend
from agent.parking.preparer import ParkingPreparer
from agent.parking.setup import ParkingOptions, build_backend, build_preparer, parse_fake_gpus
from baton.contract.names import ENV_GPUS, MIB, fake_gpu_uuid
from commands.bench.evacuate import run as run_bench
from commands.demo.fakenode import FakeNode, FakeNodeOptions

from .standin_cuda import StandInDriver, StandInNvml


def test_fake_gpu_specs():
    assert parse_fake_gpus("2x81920") == {
        fake_gpu_uuid(0): 81920 * MIB,
        fake_gpu_uuid(1): 81920 * MIB,
    }
    assert parse_fake_gpus("100, 50") == {fake_gpu_uuid(0): 100 * MIB, fake_gpu_uuid(1): 50 * MIB}
    for bad in ("2y3", "", "0x5", "10,-1"):
        with pytest.raises(ValueError, match="COUNTxMIB"):
            parse_fake_gpus(bad)


def test_build_preparer_for_each_backend(tmp_path):
    assert isinstance(build_preparer(ParkingOptions()), NullPreparer)
    fake = build_preparer(
        ParkingOptions(backend="fake", fake_gpus="2x100", fake_dir=str(tmp_path), headroom_mib=5)
    )
    assert isinstance(fake, ParkingPreparer) and isinstance(fake.backend, FakeBackend)
    assert fake.host_budget == 4 * 200 * MIB and fake.headroom == 5 * MIB
    budget = build_preparer(
        ParkingOptions(backend="fake", fake_dir=str(tmp_path), host_memory_budget_mib=64)
    )
    assert isinstance(budget, ParkingPreparer) and budget.host_budget == 64 * MIB
    app = build_preparer(ParkingOptions(backend="app", fake_gpus="1x100"))
    assert isinstance(app, ParkingPreparer) and app.backend.name == "app"
    with pytest.raises(BackendUnavailable, match="unknown backend 'tpu'"):
        build_preparer(ParkingOptions(backend="tpu"))


def test_evacuate_bench_reports_its_fields():
    result = run_bench("fake", 8, 1)
    assert result["backend"] == "fake" and result["bytes"] == 8 * MIB
    for key in ("out_gbps", "in_gbps", "memcpy_gbps"):
        assert result[key] > 0
    with pytest.raises(ValueError, match="fake, cuda"):
        run_bench("tpu", 8, 1)


REAL_GPU = "GPU-0e9a7c52-0000-4a2b-9c1d-000000000001"


def test_a_simulated_inventory_is_kept_where_nvml_sees_a_real_gpu(monkeypatch):
    monkeypatch.setattr("agent.parking.setup.nvml_gpus", lambda: {REAL_GPU: 141 * 1024 * MIB})
    opts = ParkingOptions(backend="app", fake_gpus="1x1600", simulated_inventory=True)
    assert build_backend(opts)[1] == {fake_gpu_uuid(0): 1600 * MIB}
    assert build_backend(ParkingOptions(backend="app"))[1] == {REAL_GPU: 141 * 1024 * MIB}


def test_the_fake_node_gives_its_agent_the_gpus_its_tenants_are_given(monkeypatch):
    monkeypatch.setattr("agent.parking.setup.nvml_gpus", lambda: {REAL_GPU: 141 * 1024 * MIB})
    node = FakeNode(FakeNodeOptions(backend="app", fake_gpus="1x1600"))

    async def started() -> tuple[dict[str, int], int]:
        await node.start()
        try:
            assert node.preparer is not None
            return dict(node.preparer.gpu_memory), node.preparer.headroom
        finally:
            await node.stop()

    assert asyncio.run(started()) == ({fake_gpu_uuid(0): 1600 * MIB}, 0)
    assert node.tenant_env(0)[ENV_GPUS] == fake_gpu_uuid(0)


def test_app_tenants_parked_on_a_real_gpu_leave_room_for_their_cuda_contexts(monkeypatch):
    monkeypatch.setattr("agent.parking.setup.nvml_gpus", lambda: {REAL_GPU: 141 * 1024 * MIB})
    app = build_preparer(ParkingOptions(backend="app"))
    assert isinstance(app, ParkingPreparer)
    assert app.headroom == PARKED_HEADROOM >= 3 * 512 * MIB
    simulated = build_preparer(ParkingOptions(backend="app", simulated_inventory=True))
    assert isinstance(simulated, ParkingPreparer) and simulated.headroom == 0
    flagged = build_preparer(ParkingOptions(backend="app", headroom_mib=7))
    assert isinstance(flagged, ParkingPreparer) and flagged.headroom == 7 * MIB


def test_the_cuda_move_deadlines_come_from_the_options(monkeypatch):
    driver = StandInDriver()
    monkeypatch.setattr(cuda_mod, "load_modules", lambda: (driver, StandInNvml(driver, {})))
    monkeypatch.setattr(cuda_mod, "bindings_version", lambda: "13.0.3")
    opts = ParkingOptions(backend="cuda", driver_call_timeout_s=42.0, slowest_copy_gbps=3.0)
    backend, _ = build_backend(opts)
    assert isinstance(backend, cuda_mod.CudaBackend) and backend.bindings == "13.0.3"
    assert backend.calls.call_timeout_s == 42.0 and backend.calls.copy_bytes_per_s == 3e9


def test_the_move_deadlines_have_flags_and_env_twins(monkeypatch):
    from tests.agent.test_assembly import _configs

    flags = ["--driver-call-timeout", "30", "--slowest-copy-gbps", "2.5"]
    result, seen = _configs(monkeypatch, flags, {})
    assert result.exit_code == 0, result.output
    assert (seen[0].parking.driver_call_timeout_s, seen[0].parking.slowest_copy_gbps) == (30, 2.5)
    env = {"BATON_DRIVER_CALL_TIMEOUT": "7", "BATON_SLOWEST_COPY_GBPS": "4"}
    result, seen = _configs(monkeypatch, [], env)
    assert result.exit_code == 0, result.output
    assert (seen[0].parking.driver_call_timeout_s, seen[0].parking.slowest_copy_gbps) == (7, 4)
    result, seen = _configs(monkeypatch, ["--slowest-copy-gbps", "0"], {})
    assert result.exit_code != 0 and not seen and "must be above 0" in result.output

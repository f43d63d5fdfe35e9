"""Building the preparer from the agent's flags, and the evacuate bench's report."""

from __future__ import annotations

import pytest

from agent.core.residency import NullPreparer
from agent.parking.backends.base import BackendUnavailable
from agent.parking.backends.fake import FakeBackend
from agent.parking.preparer import ParkingPreparer
from agent.parking.setup import ParkingOptions, build_preparer, parse_fake_gpus
from baton.bench.evacuate import run as run_bench
from baton.contract.names import MIB, fake_gpu_uuid


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

"""The driver's health stream (`DRAResourceHealth`) as the kubelet reads it, and the slice's
taints that follow a GPU's health."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from baton._pb import drahealth_pb2
from dra import service
from dra.daemon import Driver
from dra.slices import slice_name
from nodegpu.health import UNKNOWN
from nodegpu.inventory import Inventory
from nodegpu.state import LiveInventory
from tests.dra.test_driver import GPUS, WAIT_S, Claims, _start
from tests.dra.test_slices import Slices
from tests.harness.drakubelet import DraKubeletStub


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[Driver, DraKubeletStub, Claims, Slices]]:
    claims, slices = Claims(), Slices()
    driver = _start(tmp_path, claims, slices)
    kubelet = DraKubeletStub(tmp_path / "plugins_registry")
    yield driver, kubelet, claims, slices
    kubelet.close()
    driver.stop()


def test_health_stream_reports_an_xid_and_the_slice_taints_the_gpu(world: Any) -> None:
    driver, kubelet, _, slices = world
    kubelet.register()
    assert kubelet.wait_health(1) and driver.publisher.published.wait(WAIT_S)
    driver.health.on_xid("GPU-a", 79)
    assert kubelet.wait_health(2)
    report = {
        d.device.device_name: (d.health, d.message) for d in kubelet.health_reports[-1].devices
    }
    assert report["gpu-0"] == (2, "XID 79") and report["gpu-1"][0] == 1
    assert driver.publisher.published.wait(WAIT_S)
    devices = slices.items[slice_name("n1")]["spec"]["devices"]
    assert "taints" in devices[0] and "taints" not in devices[1]


def test_a_gpu_whose_health_nvml_does_not_report_is_unknown_in_the_stream_and_tainted(
    world: Any,
) -> None:
    """NVML not delivering a GPU's events (`nodegpu.health.NvmlHealthLoop`) is DRA's UNKNOWN,
    not UNHEALTHY: the pod's status says so; the slice still keeps new claims off it."""
    driver, kubelet, _, slices = world
    kubelet.register()
    assert kubelet.wait_health(1) and driver.publisher.published.wait(WAIT_S)
    why = f"{UNKNOWN}: its XID events cannot be registered (Not Supported)"
    driver.health.inventory.set_health("GPU-a", False, why)
    assert kubelet.wait_health(2)
    report = {
        d.device.device_name: (d.health, d.message) for d in kubelet.health_reports[-1].devices
    }
    assert report["gpu-0"] == (drahealth_pb2.UNKNOWN, why)
    assert report["gpu-1"][0] == drahealth_pb2.HEALTHY
    assert driver.publisher.published.wait(WAIT_S)
    devices = slices.items[slice_name("n1")]["spec"]["devices"]
    assert "taints" in devices[0] and "taints" not in devices[1]


def test_health_stream_repeats_every_devices_health_before_the_kubelet_forgets_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kubelet shows a device Unknown once its last report is older than the timeout sent
    with it (seen on v1.36.2): the stream repeats every device's health well within it."""
    monkeypatch.setattr(service, "HEALTH_WAIT_S", 0.01)
    ticks, checks = itertools.count(), itertools.count()
    health = service.HealthService(
        "n1",
        LiveInventory(Inventory(tuple(GPUS), 4)),
        clock=lambda: 1000.0,
        ticks=lambda: float(next(ticks)),
        resend_s=10,
    )
    context = SimpleNamespace(is_active=lambda: next(checks) < 2000)  # then the kubelet left
    stream = health.NodeWatchResources(drahealth_pb2.NodeWatchResourcesRequest(), context)
    reports = list(itertools.islice(stream, 3))
    assert len(reports) == 3, "no report repeated while nothing changed"
    for report in reports:
        assert [(d.device.device_name, d.health) for d in report.devices] == [
            ("gpu-0", drahealth_pb2.HEALTHY),
            ("gpu-1", drahealth_pb2.HEALTHY),
        ]
        assert {d.health_check_timeout_seconds for d in report.devices} == {
            service.HEALTH_TIMEOUT_S
        }
    assert service.HEALTH_RESEND_S * 2 < service.HEALTH_TIMEOUT_S

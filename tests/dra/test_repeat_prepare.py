"""A repeat NodePrepareResources answered from the record after the driver restarted: the
node's GPUs or the driver's flags may have changed since the claim was prepared."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from baton.contract import names
from dra.cdi import spec_path
from dra.daemon import Driver
from nodegpu.inventory import NodeGpu
from tests.dra.test_driver import GPUS, Claims, _settings
from tests.dra.test_slices import Slices
from tests.harness.drakubelet import DraKubeletStub


def _driver(tmp: Path, claims: Claims, gpus: list[NodeGpu], vendor: str | None) -> Driver:
    settings = dataclasses.replace(_settings(tmp), vendor_cdi=vendor)
    driver = Driver(settings, gpus, True, slices=Slices(), claims=claims)
    driver.start()
    return driver


def _prepared_then_stopped(tmp: Path, claims: Claims, vendor: str | None = None) -> None:
    """Prepare claim ns/c1 (uid-1, on gpu-0) with a driver on GPUS, then stop that driver and
    lose the claim's spec, as a node reboot does (/var/run/cdi is a tmpfs; the record is not)."""
    claims.add("ns", "c1", "uid-1", "gpu-0")
    driver = _driver(tmp, claims, GPUS, vendor)
    kubelet = DraKubeletStub(tmp / "plugins_registry")
    try:
        kubelet.register()
        assert kubelet.prepare(("ns", "uid-1", "c1")).claims["uid-1"].error == ""
    finally:
        kubelet.close()
        driver.stop()
    spec_path(tmp / "cdi", "uid-1").unlink()


def _answer(tmp: Path, claims: Claims, gpus: list[NodeGpu], vendor: str | None = None) -> Any:
    """The answer to a repeat prepare of uid-1 by a driver started on `gpus`."""
    driver = _driver(tmp, claims, gpus, vendor)
    kubelet = DraKubeletStub(tmp / "plugins_registry")
    try:
        kubelet.register()
        return kubelet.prepare(("ns", "uid-1", "c1")).claims["uid-1"]
    finally:
        kubelet.close()
        driver.stop()


def _repeat(tmp: Path, claims: Claims, gpus: list[NodeGpu]) -> str:
    """The error of a repeat prepare of uid-1 by a driver started on `gpus`."""
    return str(_answer(tmp, claims, gpus).error)


def test_a_repeat_prepare_on_a_replaced_gpu_is_refused_naming_both_uuids(tmp_path: Path) -> None:
    """The GPU under gpu-0 was swapped while the node was down: the claim was prepared (and its
    share allocated) on GPU-a, which is gone; its container must not be given GPU-a."""
    claims = Claims()
    _prepared_then_stopped(tmp_path, claims)
    swapped = [NodeGpu("GPU-c", 0, "Fake", 81920), GPUS[1]]
    error = _repeat(tmp_path, claims, swapped)
    assert "gpu-0" in error and "GPU-a" in error and "GPU-c" in error, error
    assert "\n" not in error
    assert not spec_path(tmp_path / "cdi", "uid-1").exists(), "no spec naming the gone GPU"


def test_a_repeat_prepare_on_a_gpu_the_node_no_longer_has_is_refused(tmp_path: Path) -> None:
    claims = Claims()
    _prepared_then_stopped(tmp_path, claims)
    error = _repeat(tmp_path, claims, [GPUS[1]])
    assert "gpu-0" in error and "GPU-a" in error and "no longer has" in error, error
    assert not spec_path(tmp_path / "cdi", "uid-1").exists()


@pytest.mark.parametrize(("before", "after"), [(None, "nvidia.com/gpu"), ("nvidia.com/gpu", None)])
def test_a_spec_rebuilt_after_vendor_cdi_changed_agrees_with_the_answer(
    tmp_path: Path, before: str | None, after: str | None
) -> None:
    """--vendor-cdi changed while the node was down: the rebuilt spec and the answer follow the
    setting now, together. Without NVIDIA's CDI device the spec must set
    NVIDIA_VISIBLE_DEVICES (or the container sees no GPU); with it, it must not, and the
    answer must name it (and name no vendor device the driver was told not to use)."""
    claims = Claims()
    _prepared_then_stopped(tmp_path, claims, before)
    answer = _answer(tmp_path, claims, GPUS, after)
    assert answer.error == ""
    (device,) = answer.devices
    vendor_ids = [i for i in device.cdi_device_ids if i.startswith("nvidia.com/gpu=")]
    spec = json.loads(spec_path(tmp_path / "cdi", "uid-1").read_text())
    env = spec["devices"][0]["containerEdits"]["env"]
    visible = f"{names.ENV_NVIDIA_VISIBLE_DEVICES}=GPU-a"
    assert (visible in env) == (not vendor_ids), env
    assert vendor_ids == (["nvidia.com/gpu=GPU-a"] if after else []), list(device.cdi_device_ids)
    spec_path(tmp_path / "cdi", "uid-1").unlink()
    assert _answer(tmp_path, claims, GPUS, after) == answer, "recorded as answered"

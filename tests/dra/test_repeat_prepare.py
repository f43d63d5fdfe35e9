"""A repeat NodePrepareResources answered from the record after the driver restarted: the
node's GPUs or the driver's flags may have changed since the claim was prepared."""

from __future__ import annotations

from pathlib import Path

from dra.cdi import spec_path
from dra.daemon import Driver
from nodegpu.inventory import NodeGpu
from tests.dra.test_driver import GPUS, Claims, _settings, _start
from tests.dra.test_slices import Slices
from tests.harness.drakubelet import DraKubeletStub


def _prepared_then_stopped(tmp: Path, claims: Claims) -> None:
    """Prepare claim ns/c1 (uid-1, on gpu-0) with a driver on GPUS, then stop that driver and
    lose the claim's spec, as a node reboot does (/var/run/cdi is a tmpfs; the record is not)."""
    claims.add("ns", "c1", "uid-1", "gpu-0")
    driver = _start(tmp, claims, Slices())
    kubelet = DraKubeletStub(tmp / "plugins_registry")
    try:
        kubelet.register()
        assert kubelet.prepare(("ns", "uid-1", "c1")).claims["uid-1"].error == ""
    finally:
        kubelet.close()
        driver.stop()
    spec_path(tmp / "cdi", "uid-1").unlink()


def _repeat(tmp: Path, claims: Claims, gpus: list[NodeGpu]) -> str:
    """The error of a repeat prepare of uid-1 by a driver started on `gpus`."""
    driver = Driver(_settings(tmp), gpus, True, slices=Slices(), claims=claims)
    driver.start()
    kubelet = DraKubeletStub(tmp / "plugins_registry")
    try:
        kubelet.register()
        return str(kubelet.prepare(("ns", "uid-1", "c1")).claims["uid-1"].error)
    finally:
        kubelet.close()
        driver.stop()


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

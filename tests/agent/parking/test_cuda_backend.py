"""The cuda backend against a stand-in driver: lock, checkpoint, restore, unlock and failures."""

from __future__ import annotations

import pytest

from agent.parking.backends import cuda as cuda_mod
from agent.parking.backends.base import BackendError, BackendUnavailable, Residency, TenantRef
from agent.parking.backends.cuda import CudaBackend

from .standin_cuda import CHECKPOINTED, RUNNING, CUresult, StandInDriver, StandInNvml

GPU = "GPU-11111111-2222-3333-4444-555555555555"
GIB = 1024**3


@pytest.fixture
def node():
    driver = StandInDriver(states={100: RUNNING, 101: RUNNING, 200: RUNNING})
    nvml = StandInNvml(driver, {GPU: 80 * GIB})
    nvml.used[GPU] = {100: 3 * GIB, 101: 1 * GIB, 200: 2 * GIB}
    backend = CudaBackend(driver, nvml, lock_timeout_ms=1500)
    backend.attach(TenantRef("a", (GPU,), pids=(100, 101)))
    return driver, nvml, backend


def test_park_locks_then_checkpoints_every_process_and_restore_undoes_it(node):
    driver, _, backend = node
    assert backend.footprint("a", GPU) == 4 * GIB
    move = backend.park("a", GPU)
    assert move.bytes == 4 * GIB
    assert driver.calls == [("lock", 100), ("lock", 101), ("checkpoint", 100), ("checkpoint", 101)]
    assert driver.lock_timeouts == [1500, 1500]
    assert driver.states[100] == driver.states[101] == CHECKPOINTED
    st = backend.state("a")
    assert st.residency == {GPU: Residency.PARKED} and st.parked_bytes == 4 * GIB
    assert backend.park("a", GPU).bytes == 0
    assert backend.restore("a", GPU).bytes == 4 * GIB
    assert driver.states[100] == driver.states[101] == RUNNING
    assert backend.state("a").residency == {GPU: Residency.RESIDENT}


def test_a_lock_timeout_leaves_the_tenant_running(node):
    driver, _, backend = node
    driver.fail[("lock", 101)] = CUresult.CUDA_ERROR_NOT_READY
    with pytest.raises(BackendError, match=r"Lock \(1500 ms\) on pid 101 failed: CUDA_ERROR_NOT"):
        backend.park("a", GPU)
    assert driver.states[100] == driver.states[101] == RUNNING
    assert backend.state("a").residency == {GPU: Residency.RESIDENT}
    backend.park("a", GPU)
    assert driver.states[101] == CHECKPOINTED


def test_a_failed_checkpoint_is_rolled_back(node):
    driver, _, backend = node
    driver.fail[("checkpoint", 101)] = CUresult.CUDA_ERROR_NOT_SUPPORTED
    with pytest.raises(BackendError, match="CUDA_ERROR_NOT_SUPPORTED"):
        backend.park("a", GPU)
    assert driver.states[100] == driver.states[101] == RUNNING
    assert backend.state("a").detail == ""


def test_a_rollback_that_fails_is_reported_not_hidden(node):
    driver, _, backend = node
    driver.fail[("checkpoint", 101)] = CUresult.CUDA_ERROR_NOT_SUPPORTED
    driver.fail[("restore", 100)] = CUresult.CUDA_ERROR_ILLEGAL_STATE
    with pytest.raises(BackendError):
        backend.park("a", GPU)
    assert "could not be returned to running" in backend.state("a").detail
    assert "100" in backend.state("a").detail


def test_a_failed_restore_is_reported_and_can_be_retried(node):
    driver, _, backend = node
    backend.park("a", GPU)
    driver.fail[("restore", 101)] = CUresult.CUDA_ERROR_ILLEGAL_STATE
    with pytest.raises(BackendError, match="pid 101"):
        backend.restore("a", GPU)
    assert "restore incomplete" in backend.state("a").detail
    assert driver.states[100] == RUNNING and driver.states[101] == CHECKPOINTED
    backend.restore("a", GPU)
    assert driver.states[101] == RUNNING and backend.state("a").detail == ""


def test_pod_processes_are_found_by_cgroup(tmp_path):
    driver = StandInDriver(states={100: RUNNING, 200: RUNNING})
    nvml = StandInNvml(driver, {GPU: 80 * GIB})
    nvml.used[GPU] = {100: 3 * GIB, 200: 2 * GIB}
    uid = "0f1e2d3c-aaaa-bbbb-cccc-123456789abc"
    pod_cg = f"/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-x.scope"
    for pid, cg in ((100, pod_cg), (200, "/system.slice/other.scope")):
        (tmp_path / "proc" / str(pid)).mkdir(parents=True)
        (tmp_path / "proc" / str(pid) / "cgroup").write_text(f"0::{cg}\n")
    limit_dir = tmp_path / "cg" / pod_cg.lstrip("/")
    limit_dir.mkdir(parents=True)
    (limit_dir / "memory.max").write_text("max\n")
    (limit_dir.parent / "memory.max").write_text(f"{2 * GIB}\n")
    backend = CudaBackend(
        driver, nvml, proc_root=str(tmp_path / "proc"), cgroup_root=str(tmp_path / "cg")
    )
    backend.attach(TenantRef("pod", (GPU,), pod_uid=uid))
    assert backend.pids("pod") == (100,)
    assert backend.footprint("pod", GPU) == 3 * GIB
    assert backend.memory_limit("pod") == 2 * GIB
    backend.park("pod", GPU)
    assert backend.pids("pod") == (100,) and backend.footprint("pod", GPU) == 3 * GIB


def test_a_restarted_agent_finds_processes_still_parked(node):
    driver, nvml, backend = node
    backend.park("a", GPU)
    again = CudaBackend(driver, nvml)
    again.attach(TenantRef("a", (GPU,), pids=(100, 101), declared_bytes=4 * GIB))
    assert again.state("a").residency == {GPU: Residency.PARKED}
    again.restore("a", GPU)
    assert driver.states[100] == RUNNING


def test_an_old_driver_is_refused_with_the_version_needed():
    driver = StandInDriver(version=12040)
    with pytest.raises(BackendUnavailable, match=r"driver 570 or newer.*supports CUDA 12\.4"):
        CudaBackend(driver, StandInNvml(driver, {}))


def test_without_cuda_python_the_install_hint_is_given(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_cuda(name, *args, **kwargs):
        if name.startswith(("cuda", "pynvml")):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_cuda)
    with pytest.raises(BackendUnavailable, match=r"pip install 'baton-gpu\[cuda\]'"):
        cuda_mod.load_modules()

"""The cuda backend against a stand-in driver: park, restore, rollbacks, states, restarts."""

from __future__ import annotations

import pytest

from agent.parking.backends import cuda as cuda_mod
from agent.parking.backends.base import (
    BackendError,
    BackendQuarantined,
    BackendUnavailable,
    Residency,
    TenantRef,
)
from agent.parking.backends.cuda import DEFAULT_HEADROOM, CudaBackend

from .standin_cuda import (
    CHECKPOINTED,
    FAILED,
    LOCKED,
    RUNNING,
    CUresult,
    StandInDriver,
    StandInNvml,
)

GPU = "GPU-11111111-2222-3333-4444-555555555555"
GIB = 1024**3


def moves(driver: StandInDriver) -> list[tuple[str, int]]:
    """The driver calls that change a process's state (state queries left out)."""
    return [c for c in driver.calls if c[0] != "state"]


@pytest.fixture
def node(tmp_path):
    driver = StandInDriver(states={100: RUNNING, 101: RUNNING, 200: RUNNING})
    nvml = StandInNvml(driver, {GPU: 80 * GIB})
    nvml.used[GPU] = {100: 3 * GIB, 101: 1 * GIB, 200: 2 * GIB}
    backend = CudaBackend(driver, nvml, lock_timeout_ms=1500, proc_root=str(tmp_path))
    backend.attach(TenantRef("a", (GPU,), pids=(100, 101)))
    yield driver, nvml, backend
    driver.hang_over.set()


def test_park_locks_then_checkpoints_every_process_and_restore_undoes_it(node):
    driver, nvml, backend = node
    assert backend.footprint("a", GPU) == 4 * GIB
    move = backend.park("a", GPU)
    assert move.bytes == 4 * GIB
    assert moves(driver) == [("lock", 100), ("lock", 101), ("checkpoint", 100), ("checkpoint", 101)]
    assert driver.lock_timeouts == [1500, 1500]
    assert driver.states[100] == driver.states[101] == CHECKPOINTED
    assert nvml.free(GPU) == 78 * GIB
    st = backend.state("a")
    assert st.residency == {GPU: Residency.PARKED} and st.parked_bytes == 4 * GIB
    assert backend.park("a", GPU).bytes == 0
    driver.calls.clear()
    assert backend.restore("a", GPU).bytes == 4 * GIB
    assert moves(driver) == [("restore", 100), ("restore", 101), ("unlock", 100), ("unlock", 101)]
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
    driver.fail[("checkpoint", 101)] = CUresult.CUDA_ERROR_INVALID_CONTEXT
    with pytest.raises(BackendError, match="CUDA_ERROR_INVALID_CONTEXT"):
        backend.park("a", GPU)
    assert driver.states[100] == driver.states[101] == RUNNING
    st = backend.state("a")
    assert st.detail == "" and st.quarantined == ""


def test_a_rollback_that_fails_quarantines_the_tenant(node):
    driver, _, backend = node
    driver.fail[("checkpoint", 101)] = CUresult.CUDA_ERROR_INVALID_CONTEXT
    driver.fail[("restore", 100)] = CUresult.CUDA_ERROR_ILLEGAL_STATE
    with pytest.raises(BackendQuarantined, match=r"could not be undone.*pid 100"):
        backend.park("a", GPU)
    assert "could not be undone" in backend.state("a").quarantined
    driver.calls.clear()
    with pytest.raises(BackendQuarantined):
        backend.park("a", GPU)
    assert moves(driver) == []


def test_a_failed_restore_parks_the_restored_ones_again_and_can_be_retried(node):
    driver, _, backend = node
    backend.park("a", GPU)
    driver.fail[("restore", 101)] = CUresult.CUDA_ERROR_ILLEGAL_STATE
    with pytest.raises(BackendError, match="pid 101") as failed:
        backend.restore("a", GPU)
    assert not isinstance(failed.value, BackendQuarantined)
    assert driver.states[100] == driver.states[101] == CHECKPOINTED
    assert backend.state("a").residency == {GPU: Residency.PARKED}
    backend.restore("a", GPU)
    assert driver.states[100] == driver.states[101] == RUNNING


@pytest.mark.parametrize("when", ["restore", "unlock"])
def test_a_process_that_exits_while_parked_leaves_the_others_restored(node, when):
    driver, _, backend = node
    backend.park("a", GPU)
    driver.exit_before.add((when, 101))  # its memory went with it: nothing to bring back
    move = backend.restore("a", GPU)
    assert driver.states == {100: RUNNING, 200: RUNNING}
    assert move.bytes == 3 * GIB
    st = backend.state("a")
    assert st.quarantined == "" and st.residency == {GPU: Residency.RESIDENT}
    assert st.pids == (100,) and st.footprint_bytes == {GPU: 3 * GIB}
    assert backend.park("a", GPU).bytes == 3 * GIB


def test_a_process_left_failed_by_a_checkpoint_quarantines_the_tenant(node):
    driver, _, backend = node
    driver.fail[("checkpoint", 101)] = CUresult.CUDA_ERROR_UNKNOWN
    driver.leaves[("checkpoint", 101)] = FAILED
    with pytest.raises(BackendQuarantined, match="pid 101 is failed"):
        backend.park("a", GPU)
    assert driver.states[100] == RUNNING
    assert "pid 101 is failed" in backend.state("a").quarantined


def test_a_process_not_running_after_its_restore_quarantines_the_tenant(node):
    driver, _, backend = node
    backend.park("a", GPU)
    driver.fail[("unlock", 101)] = CUresult.CUDA_ERROR_UNKNOWN
    driver.leaves[("unlock", 101)] = FAILED
    with pytest.raises(BackendQuarantined, match="pid 101 is failed"):
        backend.restore("a", GPU)
    st = backend.state("a")
    assert st.quarantined and st.residency != {GPU: Residency.RESIDENT}


def test_a_restarted_backend_confirms_what_was_parked_with_the_driver(node):
    driver, nvml, backend = node
    backend.attach(TenantRef("b", (GPU,), pids=(200,)))
    backend.park("a", GPU)
    backend.park("b", GPU)
    saved = backend.durable()
    assert saved["a"]["pids"] == {"100": {GPU: 3 * GIB}, "101": {GPU: 1 * GIB}}
    driver.states[200] = LOCKED  # the old agent died between restoring and unlocking b
    again = CudaBackend(driver, nvml)
    again.adopt(saved)
    assert again.tenants() == ["a", "b"]
    again.attach(TenantRef("a", (GPU,), pod_uid=""))
    assert again.state("a").residency == {GPU: Residency.PARKED}
    assert again.state("a").parked_bytes == 4 * GIB
    assert again.state("b").parked_bytes == 0 and driver.states[200] == RUNNING
    again.restore("a", GPU)
    assert driver.states[100] == driver.states[101] == RUNNING


def test_a_restarted_backend_quarantines_a_process_the_driver_reports_failed(node):
    driver, nvml, backend = node
    backend.park("a", GPU)
    driver.states[101] = FAILED
    again = CudaBackend(driver, nvml)
    again.adopt(backend.durable())
    assert "pid 101" in again.state("a").quarantined
    with pytest.raises(BackendQuarantined):
        again.restore("a", GPU)
    assert again.durable()["a"]["quarantined"]


def test_the_default_headroom_is_not_zero(node):
    driver, nvml, _ = node
    assert CudaBackend(driver, nvml).headroom_bytes == DEFAULT_HEADROOM >= 512 * 1024**2


def test_an_old_driver_is_refused_with_the_version_needed():
    driver = StandInDriver(version=12040)
    with pytest.raises(BackendUnavailable, match=r"driver 575\.57 or newer.*supports CUDA 12\.4"):
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


@pytest.mark.parametrize(
    ("cut_off", "first"), [("restore", "state"), ("park", "state"), ("park", "park")]
)
def test_a_restart_mid_move_leaves_no_tenant_half_parked(node, cut_off, first):
    """The old agent died with 100 checkpointed and 101 locked: mid-restore (101 brought back,
    the record says both parked) or mid-park (101 not checkpointed yet, no record). 101 holds
    its device memory: unlocked, it would run on beside whoever holds the GPU next while the
    tenant counts as parked. The move is finished as a park: all or none."""
    driver, nvml, backend = node
    backend.park("a", GPU)
    saved = backend.durable() if cut_off == "restore" else {}
    driver.states[101] = LOCKED
    again = CudaBackend(driver, nvml)
    again.adopt(saved)
    again.attach(TenantRef("a", (GPU,), pids=(100, 101)))
    if first == "park":  # the restarted agent's first word about the tenant is a park
        again.park("a", GPU)
    st = again.state("a")
    assert driver.states[100] == driver.states[101] == CHECKPOINTED
    assert st.residency == {GPU: Residency.PARKED} and st.pids == (100, 101)
    assert again.park("a", GPU).bytes == 0  # parked already: nothing left on the GPU
    assert nvml.free(GPU) == 78 * GIB  # only pid 200 (2 GiB, not a's) is on the GPU
    again.restore("a", GPU)
    assert driver.states[100] == driver.states[101] == RUNNING


def test_an_unlock_that_fails_still_unlocks_the_other_restored_processes(node):
    """A failed unlock of 100 quarantines the tenant, but 101, restored with it, must not be
    left locked for ever (its CUDA calls would block with no reason given)."""
    driver, _, backend = node
    backend.park("a", GPU)
    driver.fail[("unlock", 100)] = CUresult.CUDA_ERROR_UNKNOWN
    with pytest.raises(BackendQuarantined, match="pid 100 is locked"):
        backend.restore("a", GPU)
    assert driver.states[100] == LOCKED and driver.states[101] == RUNNING
    assert backend.state("a").quarantined

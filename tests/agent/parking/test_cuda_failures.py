"""The cuda backend and the driver's failure modes: memory, missing contexts, stalls, sharing."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from prometheus_client import CollectorRegistry

from agent.core.errors import Quarantined
from agent.core.residency import NoRoom
from agent.parking.backends import cuda_moves
from agent.parking.backends.base import (
    BackendError,
    BackendQuarantined,
    Residency,
    TenantRef,
    Unparkable,
)
from agent.parking.backends.cuda import CudaBackend
from agent.parking.preparer import ParkingPreparer

from .standin_cuda import CHECKPOINTED, LOCKED, RUNNING, CUresult, StandInDriver, StandInNvml
from .test_cuda_backend import GIB, GPU, moves

MIB = 1024**2


@pytest.fixture
def node(tmp_path):
    driver = StandInDriver(states={100: RUNNING, 101: RUNNING, 200: RUNNING})
    nvml = StandInNvml(driver, {GPU: 10 * GIB})
    nvml.used[GPU] = {100: 3 * GIB, 101: 1 * GIB, 200: 4 * GIB}
    backend = CudaBackend(
        driver, nvml, lock_timeout_ms=100, proc_root=str(tmp_path), call_timeout_s=0.3
    )
    backend.attach(TenantRef("a", (GPU,), pids=(100, 101)))
    backend.attach(TenantRef("b", (GPU,), pids=(200,)))
    yield driver, nvml, backend
    driver.hang_over.set()


def test_a_restore_without_room_for_its_bytes_and_the_headroom_is_not_tried(node):
    driver, nvml, backend = node
    backend.park("a", GPU)
    nvml.other[GPU] = 2 * GIB  # 10 - 4 (b) - 2 = 4 GiB free: the 4 GiB fit, the headroom not
    driver.calls.clear()
    with pytest.raises(BackendError, match=r"needs 5120 MiB free .* NVML reports 4096 MiB free"):
        backend.restore("a", GPU)
    assert moves(driver) == [] and driver.poisoned == set()
    assert backend.state("a").residency == {GPU: Residency.PARKED}
    nvml.other[GPU] = 0
    backend.restore("a", GPU)
    assert driver.states[100] == driver.states[101] == RUNNING


class Host:
    """A `ParkingHost` with tenants a and b that records what it is told."""

    def __init__(self) -> None:
        self.quarantined: list[tuple[str, str]] = []
        self.saves = 0

    def tenant_refs(self) -> dict[str, TenantRef]:
        return {
            "a": TenantRef("a", (GPU,), pids=(100, 101)),
            "b": TenantRef("b", (GPU,), pids=(200,)),
        }

    def quarantine(self, tenant_id: str, why: str) -> None:
        self.quarantined.append((tenant_id, why))

    def persist(self) -> None:
        self.saves += 1


def test_a_restore_that_ran_out_of_memory_is_never_retried(node):
    driver, _, backend = node
    reg = CollectorRegistry()
    host = Host()
    prep = ParkingPreparer(
        backend, {GPU: 10 * GIB}, host_budget=20 * GIB, registry=reg, backoff=0.0, host=host
    )
    told = host.quarantined
    backend.park("a", GPU)
    driver.fail[("restore", 101)] = CUresult.CUDA_ERROR_OUT_OF_MEMORY

    async def turn() -> None:
        await prep.prepare("a", [GPU])

    with pytest.raises(Quarantined, match="out of device memory"):
        asyncio.run(asyncio.wait_for(turn(), 10))
    assert moves(driver).count(("restore", 101)) == 1
    assert driver.states[100] == driver.states[101] == CHECKPOINTED  # 100 parked again
    assert told and told[0][0] == "a"
    assert host.saves  # the host saved its state after the moves
    entry = prep.status()["tenants"]["a"]
    assert entry["residency"] == "quarantined" and "out of device memory" in entry["quarantined"]
    assert reg.get_sample_value("baton_quarantined_tenants") == 1
    with pytest.raises(Quarantined):
        asyncio.run(asyncio.wait_for(turn(), 10))
    assert moves(driver).count(("restore", 101)) == 1


def test_an_out_of_memory_restore_poisons_the_process(node):
    driver, _, backend = node
    backend.headroom_bytes = 0
    backend.park("a", GPU)
    driver.fail[("restore", 100)] = CUresult.CUDA_ERROR_OUT_OF_MEMORY
    with pytest.raises(BackendQuarantined):
        backend.restore("a", GPU)
    assert driver.cuCheckpointProcessRestore(100, None) == (CUresult.CUDA_ERROR_OPERATING_SYSTEM,)
    assert driver.cuCheckpointProcessUnlock(100, None) == (CUresult.CUDA_ERROR_ILLEGAL_STATE,)


def test_a_process_without_a_context_is_not_an_error(node):
    driver, _, backend = node
    driver.no_context.add(102)
    backend.attach(TenantRef("a", (GPU,), pids=(100, 101, 102)))
    backend.attach(TenantRef("fresh", (GPU,), pids=(102,)))
    assert backend.pids("a") == (100, 101)
    st = backend.state("fresh")
    assert st.residency == {GPU: Residency.RESIDENT} and st.footprint_bytes == {GPU: 0}
    assert st.detail == "" and st.quarantined == ""
    backend.park("a", GPU)
    assert ("lock", 102) not in driver.calls


def test_processes_sharing_memory_are_refused_not_hung(node):
    driver, _, backend = node
    driver.shared.append({100, 101})  # NCCL ranks: calls on 101 wait while 100 is locked
    started = time.monotonic()
    with pytest.raises(Unparkable, match="share GPU memory"):
        backend.park("a", GPU)
    assert time.monotonic() - started < 5
    assert driver.states[100] == driver.states[101] == RUNNING
    st = backend.state("a")
    assert "share GPU memory" in st.unparkable and st.quarantined == ""
    driver.calls.clear()
    with pytest.raises(Unparkable):
        backend.park("a", GPU)
    assert moves(driver) == []


def test_a_lock_that_lands_after_the_park_was_undone_is_unlocked(node):
    driver, _, backend = node
    driver.shared.append({100, 101})
    driver.lands_late = threading.Event()  # 101's lock waits on 100, and is carried out later
    with pytest.raises(Unparkable, match="share GPU memory"):
        backend.park("a", GPU)
    assert driver.states[100] == driver.states[101] == RUNNING
    driver.lands_late.set()  # the hung lock of 101 now locks it
    for thread in threading.enumerate():
        if thread.name.startswith("driver-call cuCheckpointProcessLock on pid 101"):
            thread.join(5)
            assert not thread.is_alive()
    assert moves(driver)[-2:] == [("lock", 101), ("unlock", 101)]
    assert driver.states[100] == driver.states[101] == RUNNING


def test_a_lookup_leaves_a_late_lock_to_its_undo_and_quarantines_nothing(node, monkeypatch):
    """Between a late lock returning and its undo (in the call's thread), a lookup of the
    tenant's processes finds the process locked: it leaves it to that undo. Were it to settle
    it too, one of the two unlocks would fail, and the lookup's failing quarantined the tenant
    for good."""
    driver, _, backend = node
    driver.shared.append({100, 101})
    driver.lands_late = threading.Event()
    landed, undo, undone = threading.Event(), threading.Event(), threading.Event()
    unlock_late, unlock = cuda_moves.unlock_late, driver.cuCheckpointProcessUnlock

    def held_undo(calls, pid):  # the call's thread, between the lock returning and its undo
        landed.set()
        assert undo.wait(5)
        unlock_late(calls, pid)
        undone.set()

    def lookup_unlock(pid, args):  # a lookup's unlock of 101 comes second: the undo ran
        if pid == 101 and not undo.is_set():
            undo.set()
            undone.wait(5)
        return unlock(pid, args)

    monkeypatch.setattr(cuda_moves, "unlock_late", held_undo)
    monkeypatch.setattr(driver, "cuCheckpointProcessUnlock", lookup_unlock)
    with pytest.raises(Unparkable, match="share GPU memory"):
        backend.park("a", GPU)
    driver.shared.clear()  # a state query of 100 does not wait on 101 (the late lock does)
    driver.lands_late.set()
    assert landed.wait(5) and driver.states[101] == LOCKED
    backend.rescan("a")
    assert backend.state("a").quarantined == ""  # a lookup while the undo is pending
    undo.set()
    assert undone.wait(5)
    assert driver.states[100] == driver.states[101] == RUNNING
    assert moves(driver).count(("unlock", 101)) == 1
    assert backend.state("a").quarantined == ""


def test_a_tenant_mapping_nccl_shared_memory_is_refused_before_any_lock(node, tmp_path):
    driver, _, backend = node
    (tmp_path / "101").mkdir()
    (tmp_path / "101" / "maps").write_text("7f00-7f10 rw-s 0 00:1a 9 /dev/shm/nccl-Ab12Cd\n")
    with pytest.raises(Unparkable, match="NCCL"):
        backend.park("a", GPU)
    assert moves(driver) == []


def test_a_checkpoint_the_driver_does_not_support_is_refused(node):
    driver, _, backend = node
    driver.fail[("checkpoint", 100)] = CUresult.CUDA_ERROR_NOT_SUPPORTED
    with pytest.raises(Unparkable, match="managed memory"):
        backend.park("a", GPU)
    assert driver.states[100] == driver.states[101] == RUNNING


def test_the_planner_leaves_a_refused_tenant_resident_and_says_why(node):
    driver, _, backend = node
    driver.shared.append({100, 101})
    prep = ParkingPreparer(backend, {GPU: 10 * GIB}, host_budget=20 * GIB, backoff=0.0)
    prep.register(TenantRef("a", (GPU,), pids=(100, 101)))
    prep.register(TenantRef("b", (GPU,), pids=(200,)))
    prep.register(TenantRef("c", (GPU,), declared_bytes=7 * GIB))

    async def turns() -> None:
        await prep.prepare("a", [GPU])
        await prep.prepare("b", [GPU])
        await prep.prepare("c", [GPU])

    with pytest.raises(NoRoom, match="share GPU memory"):
        asyncio.run(asyncio.wait_for(turns(), 10))
    with pytest.raises(NoRoom, match=r"a stays resident: .*share GPU memory"):
        asyncio.run(asyncio.wait_for(prep.prepare("c", [GPU]), 10))
    assert "share GPU memory" in prep.status()["tenants"]["a"]["not_parkable"]
    assert driver.states[100] == driver.states[101] == RUNNING


def test_a_tenant_whose_state_query_is_not_supported_is_refused_at_once_and_says_why(node):
    driver, _, backend = node
    driver.unsupported |= {100, 101}  # e.g. a container runtime or MIG the driver cannot checkpoint
    prep = ParkingPreparer(backend, {GPU: 10 * GIB}, host_budget=20 * GIB, backoff=0.0)
    prep.register(TenantRef("a", (GPU,), pids=(100, 101)))
    prep.register(TenantRef("b", (GPU,), pids=(200,)))
    prep.register(TenantRef("c", (GPU,), declared_bytes=7 * GIB))

    async def turns() -> None:
        await prep.prepare("a", [GPU])
        await prep.prepare("b", [GPU])  # the other tenants' turns go on
        await prep.prepare("c", [GPU])

    with pytest.raises(NoRoom, match=r"a stays resident: .*CUDA_ERROR_NOT_SUPPORTED.*parking"):
        asyncio.run(asyncio.wait_for(turns(), 10))
    st = backend.state("a")
    assert st.footprint_bytes == {GPU: 4 * GIB} and st.quarantined == ""
    assert "another parking method" in st.unparkable
    assert "CUDA_ERROR_NOT_SUPPORTED" in prep.status()["tenants"]["a"]["not_parkable"]
    assert [c for c in moves(driver) if c[1] in (100, 101)] == []  # never locked
    driver.states[300] = RUNNING
    driver.unsupported.add(300)
    backend.attach(TenantRef("d", (GPU,), pids=(300,)))  # parked before any read of it
    with pytest.raises(Unparkable, match=r"^d: cuCheckpointProcessGetState .*NOT_SUPPORTED"):
        backend.park("d", GPU)
    assert [c for c in moves(driver) if c[1] in (100, 101, 300)] == []


def test_a_call_that_does_not_return_quarantines_and_holds_no_lock(node):
    driver, _, backend = node
    backend.park("a", GPU)
    driver.hang.add(("restore", 100))
    backend.calls.copy_bytes_per_s = 1e12
    failed: list[BaseException] = []

    def restore() -> None:
        try:
            backend.restore("a", GPU)
        except BaseException as e:
            failed.append(e)

    worker = threading.Thread(target=restore, daemon=True)
    worker.start()
    assert driver.blocked.wait(5)
    answered = threading.Event()

    def other_tenant() -> None:
        backend.state("b")
        answered.set()

    threading.Thread(target=other_tenant, daemon=True).start()
    assert answered.wait(5) and worker.is_alive()  # the hung call holds nothing
    worker.join(5)
    assert failed and isinstance(failed[0], BackendQuarantined)
    assert "did not return within" in backend.state("a").quarantined

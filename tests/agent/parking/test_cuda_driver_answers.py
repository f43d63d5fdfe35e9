"""The cuda backend and what the real driver answers: late contexts, cuInit-only processes,
states 4/5, 304 after an out-of-memory restore, NVML errors, and the versions it refuses."""

from __future__ import annotations

import asyncio

import pytest

from agent.parking.backends.base import (
    BackendError,
    BackendQuarantined,
    BackendUnavailable,
    Residency,
    TenantRef,
)
from agent.parking.backends.cuda import REDISCOVER_S, CudaBackend
from agent.parking.backends.cuda_driver import check_bindings
from agent.parking.preparer import ParkingPreparer

from .standin_cuda import (
    CHECKPOINTED,
    CHECKPOINTING,
    RESTORING,
    RUNNING,
    StandInDriver,
    StandInNvml,
)
from .test_cuda_backend import GIB, GPU, moves


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def node(tmp_path):
    driver = StandInDriver(states={100: RUNNING, 101: RUNNING})
    nvml = StandInNvml(driver, {GPU: 80 * GIB})
    nvml.used[GPU] = {100: 3 * GIB, 101: 1 * GIB}
    clock = Clock()
    backend = CudaBackend(driver, nvml, proc_root=str(tmp_path), call_timeout_s=0.5, clock=clock)
    yield driver, nvml, backend, clock
    driver.hang_over.set()


def test_a_tenant_that_makes_its_context_after_its_session_opened_is_counted_and_parked(node):
    driver, _, backend, _ = node
    driver.no_context.add(200)  # a PyTorch tenant: session first, CUDA context at first use
    backend.attach(TenantRef("late", (GPU,), pids=(200,)))
    assert backend.pids("late") == () and backend.footprint("late", GPU) == 0
    driver.make_context(200, GPU, 2 * GIB)
    assert backend.footprint("late", GPU) == 2 * GIB
    assert backend.state("late").footprint_bytes == {GPU: 2 * GIB}
    assert backend.park("late", GPU).bytes == 2 * GIB


def test_a_process_that_makes_its_context_later_is_found_once_the_last_look_is_old(node):
    driver, _, backend, clock = node
    driver.no_context.add(201)
    backend.attach(TenantRef("a", (GPU,), pids=(100, 201)))
    assert backend.pids("a") == (100,)
    driver.make_context(201, GPU, GIB)
    clock.now += REDISCOVER_S
    assert backend.pids("a") == (100, 201)
    assert backend.footprint("a", GPU) == 4 * GIB


def test_a_cuinit_only_process_is_left_out_of_the_park_not_retried_forever(node):
    driver, nvml, backend, _ = node
    driver.cuinit_only.add(102)  # NVML lists it with 0 bytes; its lock answers NOT_INITIALIZED
    nvml.used[GPU][102] = 0
    backend.attach(TenantRef("a", (GPU,), pids=(100, 101, 102)))
    assert backend.park("a", GPU).bytes == 4 * GIB
    assert driver.states[100] == driver.states[101] == CHECKPOINTED
    assert backend.state("a").pids == (100, 101)
    driver.calls.clear()
    assert backend.restore("a", GPU).bytes == 4 * GIB
    assert ("restore", 102) not in moves(driver)
    assert driver.states[100] == driver.states[101] == RUNNING


def test_a_tenant_of_only_a_cuinit_process_parks_with_nothing_moved(node):
    driver, _, backend, _ = node
    driver.cuinit_only.add(102)
    backend.attach(TenantRef("idle", (GPU,), pids=(102,)))
    assert backend.park("idle", GPU).bytes == 0
    assert backend.state("idle").residency == {GPU: Residency.PARKED}
    assert backend.restore("idle", GPU).bytes == 0


def test_a_process_caught_restoring_or_checkpointing_is_asked_again_until_it_settles(node):
    driver, _, backend, _ = node
    backend.attach(TenantRef("a", (GPU,), pids=(100, 101)))
    backend.park("a", GPU)
    driver.passing[100] = [RESTORING, RESTORING]
    driver.passing[101] = [CHECKPOINTING]
    backend.restore("a", GPU)
    st = backend.state("a")
    assert st.quarantined == "" and st.residency == {GPU: Residency.RESIDENT}


def test_bindings_older_than_13_4_read_a_process_caught_mid_move_as_settling(node):
    driver, _, backend, _ = node
    driver.known_states = 4  # cuda-bindings 13.0.3 raise ValueError for states 4 and 5
    backend.attach(TenantRef("a", (GPU,), pids=(100, 101)))
    driver.passing[100] = [CHECKPOINTING]
    assert backend.park("a", GPU).bytes == 4 * GIB
    driver.passing[101] = [RESTORING, RESTORING]
    assert backend.restore("a", GPU).bytes == 4 * GIB
    st = backend.state("a")
    assert st.quarantined == "" and st.residency == {GPU: Residency.RESIDENT}


def test_an_answer_the_bindings_cannot_read_is_a_named_error_not_a_traceback(node):
    driver, _, backend, _ = node
    backend.attach(TenantRef("a", (GPU,), pids=(100, 101)))
    driver.unknown_code[("state", 101)] = 12345  # a result code newer than the bindings
    with pytest.raises(BackendError, match=r"GetState on pid 101 .* cannot read \(12345\)"):
        backend.park("a", GPU)
    assert "cannot read (12345)" in backend.state("a").unparkable
    del driver.unknown_code[("state", 101)]
    driver.unknown_code[("checkpoint", 101)] = 12345
    with pytest.raises(BackendError, match=r"Checkpoint on pid 101 .* cannot read \(12345\)"):
        backend.park("a", GPU)
    assert driver.states[100] == driver.states[101] == RUNNING  # the park was undone
    driver.known_states = 4
    driver.passing[100] = [7]  # a state no bindings name
    with pytest.raises(BackendError, match=r"GetState on pid 100 .*7 is not a valid"):
        backend.park("a", GPU)


def test_a_process_that_never_settles_quarantines_the_tenant(node):
    driver, _, backend, _ = node
    backend.attach(TenantRef("a", (GPU,), pids=(100, 101)))
    backend.park("a", GPU)
    driver.passing[100] = [RESTORING] * 10_000
    with pytest.raises(BackendQuarantined, match="pid 100 stayed restoring"):
        backend.restore("a", GPU)


def test_a_restore_answered_304_after_an_out_of_memory_one_quarantines_the_tenant(node):
    driver, nvml, backend, _ = node
    backend.attach(TenantRef("a", (GPU,), pids=(100, 101)))
    backend.park("a", GPU)
    again = CudaBackend(driver, nvml)  # a restarted agent that lost the quarantine
    again.adopt({"a": {"pids": {"100": {GPU: 3 * GIB}, "101": {GPU: GIB}}}})
    driver.poisoned.add(100)  # its restore ran out of memory before the restart
    with pytest.raises(BackendQuarantined, match="CUDA_ERROR_OPERATING_SYSTEM"):
        again.restore("a", GPU)
    assert "not retried" in again.state("a").quarantined


def test_nvml_errors_are_backend_errors(node):
    _, nvml, backend, _ = node
    backend.attach(TenantRef("gone", ("GPU-not-on-this-node",), pids=(100,)))
    with pytest.raises(BackendError, match="NVML process list of GPU-not-on-this-node"):
        backend.footprint("gone", "GPU-not-on-this-node")
    backend.attach(TenantRef("a", (GPU,), pids=(100, 101)))
    nvml.lost = True
    assert "GPU is lost" in backend.state("a").detail
    with pytest.raises(BackendError, match="GPU is lost"):
        backend.park("a", GPU)
    with pytest.raises(BackendUnavailable, match="NVML cannot list the GPUs"):
        backend.gpu_memory()


class NoRestore(StandInDriver):
    """cuda-bindings 13.0.0/13.0.1: every checkpoint call but restore."""

    def __getattribute__(self, name: str):
        if name == "cuCheckpointProcessRestore":
            raise AttributeError(name)
        return super().__getattribute__(name)


def test_bindings_without_restore_are_refused_at_start_naming_their_version():
    driver = NoRestore()
    with pytest.raises(BackendUnavailable, match=r"cuda-bindings 13\.0\.1 lack cuCheckpointProc"):
        CudaBackend(driver, StandInNvml(driver, {}), bindings="13.0.1")


@pytest.mark.parametrize("version", ["12.8.0", "12.9.0"])
def test_bindings_that_hold_the_gil_are_refused(version):
    with pytest.raises(BackendUnavailable, match=rf"cuda-bindings {version} hold the GIL"):
        check_bindings(StandInDriver(), version)


@pytest.mark.parametrize("version", ["12.9.1", "12.9.5", "13.0.3", "13.5.0", ""])
def test_bindings_with_every_call_that_release_the_gil_are_taken(version):
    check_bindings(StandInDriver(), version)


def test_a_driver_older_than_575_57_is_refused_naming_its_version():
    driver = StandInDriver()
    with pytest.raises(BackendUnavailable, match=r"575\.57 or newer .*runs 570\.158\.01"):
        CudaBackend(driver, StandInNvml(driver, {}, release="570.158.01"))
    CudaBackend(driver, StandInNvml(driver, {}, release="575.57.08"))


def test_the_planner_parks_a_tenant_whose_context_came_after_its_session_opened(tmp_path):
    driver = StandInDriver(no_context={100, 200})  # both opened their sessions, no context yet
    nvml = StandInNvml(driver, {GPU: 10 * GIB})
    backend = CudaBackend(driver, nvml, proc_root=str(tmp_path), headroom_bytes=0)
    prep = ParkingPreparer(backend, {GPU: 10 * GIB}, host_budget=20 * GIB, backoff=0.0)
    prep.register(TenantRef("a", (GPU,), pids=(100,), declared_bytes=6 * GIB))
    prep.register(TenantRef("b", (GPU,), pids=(200,), declared_bytes=6 * GIB))

    async def turns() -> None:
        await prep.prepare("a", [GPU])
        driver.make_context(100, GPU, 6 * GIB)  # its first CUDA call, in its turn
        await prep.prepare("b", [GPU])

    asyncio.run(asyncio.wait_for(turns(), 10))
    assert driver.states[100] == CHECKPOINTED
    assert backend.state("a").residency == {GPU: Residency.PARKED}

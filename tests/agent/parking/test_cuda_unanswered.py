"""A tenant the driver cannot answer a state query for (an error, an answer the bindings cannot
read, a query that does not return): it alone is held back, counted resident with the memory
NVML lists for its processes, and every other tenant of the node keeps taking turns."""

from __future__ import annotations

import asyncio

import pytest

from agent.core.residency import NoRoom
from agent.parking.backends.base import TenantRef
from agent.parking.backends.cuda import REDISCOVER_S, CudaBackend
from agent.parking.preparer import ParkingPreparer

from .standin_cuda import CHECKPOINTED, LOCKED, RUNNING, CUresult, StandInDriver, StandInNvml
from .test_cuda_backend import GIB, GPU, moves
from .test_cuda_driver_answers import Clock


@pytest.fixture
def node(tmp_path):
    """Tenants a (4 GiB in pids 100 and 101) and b (4 GiB in 200) on a 10 GiB GPU, and c, which
    declares 7 GiB: c's turn needs both parked."""
    driver = StandInDriver(states={100: RUNNING, 101: RUNNING, 200: RUNNING})
    nvml = StandInNvml(driver, {GPU: 10 * GIB})
    nvml.used[GPU] = {100: 3 * GIB, 101: 1 * GIB, 200: 4 * GIB}
    clock = Clock()
    backend = CudaBackend(
        driver, nvml, lock_timeout_ms=100, proc_root=str(tmp_path), call_timeout_s=0.3, clock=clock
    )
    prep = ParkingPreparer(backend, {GPU: 10 * GIB}, host_budget=20 * GIB, backoff=0.0)
    prep.register(TenantRef("a", (GPU,), pids=(100, 101)))
    prep.register(TenantRef("b", (GPU,), pids=(200,)))
    prep.register(TenantRef("c", (GPU,), declared_bytes=7 * GIB))
    yield driver, prep, clock
    driver.hang_over.set()


def turn(prep: ParkingPreparer, tenant_id: str) -> None:
    asyncio.run(asyncio.wait_for(prep.prepare(tenant_id, [GPU]), 10))


@pytest.mark.parametrize("answer", ["unknown error", "unreadable"])
def test_a_failed_state_query_holds_back_its_tenant_alone_until_the_driver_answers(node, answer):
    driver, prep, clock = node
    if answer == "unknown error":
        driver.state_fails[100] = CUresult.CUDA_ERROR_UNKNOWN
    else:
        driver.unknown_code[("state", 100)] = 12345  # the bindings raise KeyError
    turn(prep, "b")  # the node's read does not fail for a's error
    with pytest.raises(NoRoom) as refused:
        turn(prep, "c")  # a's 4 GiB are counted: parking b alone leaves c 6 GiB
    why = str(refused.value)
    assert "6144 MiB free); a stays resident: cuCheckpointProcessGetState on pid 100 " in why
    assert "counted resident until the driver answers" in why and "\n" not in why
    assert not [m for m in moves(driver) if m[1] in (100, 101)]
    entry = prep.status()["tenants"]["a"]
    assert entry["footprint_bytes"] == 4 * GIB and entry["residency"] == "resident"
    assert "pid 100" in entry["not_parkable"] and "quarantined" not in entry
    driver.state_fails.clear()  # a passing error: asked again once what was found is old
    driver.unknown_code.clear()
    clock.now += REDISCOVER_S
    turn(prep, "c")
    assert driver.states[100] == driver.states[101] == driver.states[200] == CHECKPOINTED
    assert "not_parkable" not in prep.status()["tenants"]["a"]


def test_a_state_query_that_does_not_return_quarantines_its_tenant_once(node):
    driver, prep, clock = node
    driver.hang.add(("state", 100))
    turn(prep, "b")
    assert driver.calls.count(("state", 100)) == 1
    stalled = r"free\); a stays resident: .*pid 100 did not return within 0.3 s"
    with pytest.raises(NoRoom, match=stalled):
        turn(prep, "c")
    clock.now += REDISCOVER_S
    turn(prep, "b")
    assert driver.calls.count(("state", 100)) == 1  # a wedged driver is not asked again
    assert not [m for m in moves(driver) if m[1] in (100, 101)]
    entry = prep.status()["tenants"]["a"]
    assert entry["residency"] == "quarantined" and entry["footprint_bytes"] == 4 * GIB


@pytest.mark.parametrize("unlock", ["fails", "does not return"])
def test_a_process_found_locked_that_will_not_unlock_quarantines_its_tenant_alone(node, unlock):
    driver, prep, clock = node
    driver.states[100] = LOCKED  # a move a restart cut off
    if unlock == "fails":
        driver.refuses[("unlock", 100)] = CUresult.CUDA_ERROR_ILLEGAL_STATE
    else:
        driver.hang.add(("unlock", 100))
    turn(prep, "b")  # the node's read does not fail for a's process
    with pytest.raises(NoRoom, match=r"free\); a stays resident: pid 100 was found locked: "):
        turn(prep, "c")
    clock.now += REDISCOVER_S
    turn(prep, "b")
    assert moves(driver).count(("unlock", 100)) == 1  # not tried again on every read
    entry = prep.status()["tenants"]["a"]
    assert entry["residency"] == "quarantined" and entry["footprint_bytes"] == 4 * GIB
    assert driver.states[100] == LOCKED and driver.states[101] == RUNNING


GPU2 = "GPU-66666666-7777-8888-9999-000000000000"


def test_an_nvml_failure_on_one_gpu_fails_no_turn_on_another(tmp_path):
    """Tenant a, on a GPU that fell off the bus, has a process left locked beside a
    checkpointed one (a move a restart cut off): NVML cannot measure it, so it is not settled.
    That fails a's read alone: b and c keep taking turns on the other GPU."""
    driver = StandInDriver(states={100: CHECKPOINTED, 101: LOCKED, 200: RUNNING})
    nvml = StandInNvml(driver, {GPU: 10 * GIB, GPU2: 10 * GIB})
    nvml.used = {GPU: {200: 4 * GIB}, GPU2: {101: GIB}}
    nvml.lost_gpus.add(GPU2)
    root = str(tmp_path)
    backend = CudaBackend(driver, nvml, lock_timeout_ms=100, proc_root=root, call_timeout_s=0.3)
    memory = {GPU: 10 * GIB, GPU2: 10 * GIB}
    prep = ParkingPreparer(backend, memory, host_budget=20 * GIB, backoff=0.0)
    prep.register(TenantRef("a", (GPU2,), pids=(100, 101)))
    prep.register(TenantRef("b", (GPU,), pids=(200,)))
    prep.register(TenantRef("c", (GPU,), declared_bytes=7 * GIB))
    turn(prep, "b")
    turn(prep, "c")  # b is parked for c
    assert driver.states[200] == CHECKPOINTED
    assert driver.states[100] == CHECKPOINTED and driver.states[101] == LOCKED
    entry = prep.status()["tenants"]["a"]
    assert "GPU is lost" in entry["detail"]

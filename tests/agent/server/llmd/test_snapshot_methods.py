"""llm-d's Snapshot/Restore on a node with two methods (`--backend cuda,app`, the driver through
its stand-in): a cuda config with the job's own PIDs runs the driver's checkpoint of them, not
the workload's offload; no config runs the job's own method (its WorkloadChannel)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest

from agent.parking.multi import MultiBackend
from agent.parking.preparer import ParkingPreparer
from agent.parking.setup import ParkingOptions
from baton._pb import snapshot_agent_pb2 as sa
from tests.agent.parking.standin_cuda import CHECKPOINTED, RUNNING, StandInDriver, StandInNvml
from tests.agent.server.llmd.llmd_client import (
    SnapshotAgentClient,
    TimeSliceOrchestratorClient,
    register_workload,
)
from tests.agent.server.llmd.test_snapshot_agent import Workload
from tests.agent.server.llmd.test_snapshot_config import Engine, _method
from tests.harness.agent import AgentRunner

GPU = "GPU-standin-0"
GIB = 1024**3


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> StandInDriver:
    """The node's driver: this test's process has a CUDA context using 2 GiB of a 10 GiB GPU."""
    driver = StandInDriver(states={os.getpid(): RUNNING})
    nvml = StandInNvml(driver, {GPU: 10 * GIB})
    nvml.used[GPU] = {os.getpid(): 2 * GIB}
    monkeypatch.setattr("agent.parking.backends.cuda.load_modules", lambda: (driver, nvml))
    return driver


@pytest.fixture
def agent(workdir: str, driver: StandInDriver) -> Iterator[AgentRunner]:
    options = ParkingOptions(backend="cuda,app", host_memory_budget_mib=20 * 1024, headroom_mib=0)
    runner = AgentRunner(
        workdir, parking=options, llmd_listen="127.0.0.1:0", llmd_groups=(f"g={GPU}",)
    ).start()
    yield runner
    runner.stop()


@pytest.fixture
def endpoint(agent: AgentRunner) -> str:
    return f"127.0.0.1:{agent.llmd_port}"


def test_a_cuda_config_checkpoints_the_jobs_processes_and_no_config_uses_its_channel(
    endpoint: str, driver: StandInDriver
) -> None:
    engine = Engine()
    handle = register_workload(endpoint, "engine", "g", engine.on_snapshot, engine.on_restore)
    client = SnapshotAgentClient(endpoint)
    try:
        for _ in range(500):
            if "engine" in {j.job_id for j in client.status().job_statuses}:
                break
            threading.Event().wait(0.01)
        cuda = sa.BackendConfig(cuda=sa.CudaBackendConfig())
        cuda.cuda.explicit_target.pids.append(os.getpid())
        op_id = client.snapshot("engine", "g", cuda)
        op = client.wait_for_operation(op_id, 0.01)
        assert op.status == sa.OPERATION_STATUS_COMPLETE, op.error
        assert _method(client, op_id) == "cuda"
        assert driver.states[os.getpid()] == CHECKPOINTED, "the driver checkpointed the process"
        assert engine.snapshots == [], "the workload's own offload did not run in its place"
        op_id = client.restore("engine", "g", cuda)
        assert client.wait_for_operation(op_id, 0.01).status == sa.OPERATION_STATUS_COMPLETE
        assert driver.states[os.getpid()] == RUNNING and _method(client, op_id) == "cuda"
        op_id = client.snapshot("engine", "g")
        op = client.wait_for_operation(op_id, 0.01)
        assert op.status == sa.OPERATION_STATUS_COMPLETE, op.error
        assert _method(client, op_id) == "app" and len(engine.snapshots) == 1
        assert driver.states[os.getpid()] == RUNNING, "the driver was left alone"
    finally:
        client.close()
        handle.close()


def test_a_workload_that_registers_again_keeps_its_process_the_jobs_own(
    endpoint: str, driver: StandInDriver
) -> None:
    """The replaced stream's end dropped its process from the job, though the process lives
    on (and holds the new stream): a cuda Snapshot naming it was then PERMISSION_DENIED."""
    engine = Engine()
    first = register_workload(endpoint, "engine", "g", engine.on_snapshot, engine.on_restore)
    client = SnapshotAgentClient(endpoint)
    again = None
    try:
        for _ in range(500):
            if "engine" in {j.job_id for j in client.status().job_statuses}:
                break
            threading.Event().wait(0.01)
        again = register_workload(endpoint, "engine", "g", engine.on_snapshot, engine.on_restore)
        assert first.ended(5), "the new registration did not replace the old stream"
        cuda = sa.BackendConfig(cuda=sa.CudaBackendConfig())
        cuda.cuda.explicit_target.pids.append(os.getpid())
        op = client.wait_for_operation(client.snapshot("engine", "g", cuda), 0.01)
        assert op.status == sa.OPERATION_STATUS_COMPLETE, op.error
        assert driver.states[os.getpid()] == CHECKPOINTED
    finally:
        client.close()
        first.close()
        if again is not None:
            again.close()


def test_a_grant_that_parks_the_job_while_a_cuda_snapshot_pins_it_keeps_one_method(
    agent: AgentRunner, endpoint: str, driver: StandInDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pin of a cuda Snapshot ran in a worker thread outside the preparer's lock: another
    job's grant parked the job through its channel after the pin had found it resident, and
    the pin then moved it to cuda. The workload's memory lay parked by `app` while the node
    counted it cuda's, resident: its next turn restored nothing (its engine stayed asleep)."""
    preparer = agent.service.preparer
    assert isinstance(preparer, ParkingPreparer) and isinstance(preparer.backend, MultiBackend)
    multi, checked, go = preparer.backend, threading.Event(), threading.Event()
    pinning = threading.local()

    def pin(tenant_id: str, method: str, pin: Any = multi.pin) -> None:
        pinning.on = True
        try:
            pin(tenant_id, method)
        finally:
            pinning.on = False

    def parked(method: str, tenant_id: str, parked: Any = multi._parked) -> bool:
        found = bool(parked(method, tenant_id))
        if getattr(pinning, "on", False):  # the pin's check is made: hold it before its write
            checked.set()
            assert go.wait(10)
        return found

    prepare = preparer.prepare

    async def granting(tenant_id: str, gpus: Any, handed: bool = False) -> None:
        if tenant_id == "llmd/trainer" and preparer._lock.locked():
            go.set()  # the grant waits for the pin: let the pin end
        await prepare(tenant_id, gpus, handed)

    monkeypatch.setattr(multi, "pin", pin)
    monkeypatch.setattr(multi, "_parked", parked)
    monkeypatch.setattr(preparer, "prepare", granting)
    engine, trainer_engine = Workload(), Workload()
    original = engine.device

    def on_snapshot(mode: int, tags: list[str]) -> None:
        go.set()  # the grant parks it through its channel while the pin is held
        engine.on_snapshot(mode, tags)

    handles = [
        register_workload(endpoint, "engine", "g", on_snapshot, engine.on_restore),
        register_workload(endpoint, "trainer", "g", trainer_engine.on_snapshot, lambda _: None),
    ]
    client = SnapshotAgentClient(endpoint)
    trainer = TimeSliceOrchestratorClient(endpoint, "trainer", "g")
    sampler = TimeSliceOrchestratorClient(endpoint, "engine", "g")
    try:
        for job in ("engine", "trainer"):
            for _ in range(500):
                if job in {j.job_id for j in client.status().job_statuses}:
                    break
                threading.Event().wait(0.01)
        assert sampler.acquire(timeout_sec=10)[0] and sampler.release()[0]  # it has run: app's
        cuda = sa.BackendConfig(cuda=sa.CudaBackendConfig())
        cuda.cuda.explicit_target.pids.append(os.getpid())
        with ThreadPoolExecutor(2) as pool:
            snapshot = pool.submit(client.snapshot, "engine", "g", cuda)
            assert checked.wait(10), "the pin never checked the job"
            acquired = pool.submit(trainer.acquire, timeout_sec=10)
            assert acquired.result(15)[0], "the trainer's turn was granted"
            with contextlib.suppress(grpc.RpcError):  # refused if it found the job parked
                client.wait_for_operation(snapshot.result(15), 0.01)
        assert trainer.release()[0]
        ok, _, restored = sampler.acquire(timeout_sec=10)
        assert ok and restored, "its turn was granted with its memory back"
        assert engine.device == original, "the job's memory came back for its turn"
        assert driver.states[os.getpid()] == RUNNING, "nothing is left checkpointed"
    finally:
        for c in (client, trainer, sampler):
            c.close()
        for handle in handles:
            handle.close()

"""llm-d's Snapshot/Restore on a node with two methods (`--backend cuda,app`, the driver through
its stand-in): a cuda config with the job's own PIDs runs the driver's checkpoint of them, not
the workload's offload; no config runs the job's own method (its WorkloadChannel)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

from agent.parking.setup import ParkingOptions
from baton._pb import snapshot_agent_pb2 as sa
from tests.agent.parking.standin_cuda import CHECKPOINTED, RUNNING, StandInDriver, StandInNvml
from tests.agent.server.llmd.llmd_client import SnapshotAgentClient, register_workload
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
def endpoint(workdir: str, driver: StandInDriver) -> Iterator[str]:
    options = ParkingOptions(backend="cuda,app", host_memory_budget_mib=20 * 1024, headroom_mib=0)
    runner = AgentRunner(
        workdir, parking=options, llmd_listen="127.0.0.1:0", llmd_groups=(f"g={GPU}",)
    ).start()
    yield f"127.0.0.1:{runner.llmd_port}"
    runner.stop()


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

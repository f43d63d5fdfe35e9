"""llm-d's Snapshot/Restore do what their BackendConfig asks or refuse with the reason: the
app channel's mode and tags reach the workload both ways; a cuda checkpoint of explicit PIDs
and an engine endpoint need the node's method (cuda, endpoint) and the job's own processes;
configs Baton has no method for are UNIMPLEMENTED; GetOperation names the method used
(trailing metadata `baton-parking-method`)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import grpc
import pytest

from agent.parking.setup import ParkingOptions, parse_fake_gpus
from baton._pb import snapshot_agent_pb2 as sa
from tests.agent.server.llmd.llmd_client import SnapshotAgentClient, register_workload
from tests.harness.agent import AgentRunner

GPU_MIB = 1024


class Engine:
    """Records what each command carried."""

    def __init__(self) -> None:
        self.snapshots: list[tuple[int, list[str]]] = []
        self.restores: list[list[str]] = []

    def on_snapshot(self, mode: int, tags: list[str]) -> None:
        self.snapshots.append((mode, tags))

    def on_restore(self, tags: list[str]) -> None:
        self.restores.append(tags)


@pytest.fixture
def endpoint(workdir: str) -> Iterator[str]:
    gpu = next(iter(parse_fake_gpus(f"1x{GPU_MIB}")))
    runner = AgentRunner(
        workdir,
        parking=ParkingOptions(backend="app", fake_gpus=f"1x{GPU_MIB}"),
        llmd_listen="127.0.0.1:0",
        llmd_groups=(f"g={gpu}",),
    ).start()
    yield f"127.0.0.1:{runner.llmd_port}"
    runner.stop()


@pytest.fixture
def client(endpoint: str) -> Iterator[SnapshotAgentClient]:
    client = SnapshotAgentClient(endpoint)
    yield client
    client.close()


@pytest.fixture
def engine(endpoint: str, client: SnapshotAgentClient) -> Iterator[Engine]:
    engine = Engine()
    modes = [sa.SUSPEND_MODE_OFFLOAD, sa.SUSPEND_MODE_DISCARD]
    handle = register_workload(
        endpoint, "engine", "g", engine.on_snapshot, engine.on_restore, supported_modes=modes
    )
    for _ in range(500):
        if "engine" in {j.job_id for j in client.status().job_statuses}:
            break
        threading.Event().wait(0.01)
    yield engine
    handle.close()


def _method(client: SnapshotAgentClient, op_id: str) -> str:
    _, call = client.stub.GetOperation.with_call(
        sa.GetOperationRequest(operation_id=op_id), timeout=10
    )
    return dict(call.trailing_metadata() or ()).get("baton-parking-method", "")


def _refused(call: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        call()  # type: ignore[operator]
    return err.value


def test_mode_and_tags_reach_the_workload_on_snapshot_and_restore(
    client: SnapshotAgentClient, engine: Engine
) -> None:
    channel = sa.AppChannelConfig(mode=sa.SUSPEND_MODE_DISCARD, tags=["kv_cache"])
    config = sa.BackendConfig(app_channel=channel)
    snap = client.wait_for_operation(client.snapshot("engine", "g", config), 0.01)
    assert snap.status == sa.OPERATION_STATUS_COMPLETE, snap.error
    back = client.wait_for_operation(client.restore("engine", "g", config), 0.01)
    assert back.status == sa.OPERATION_STATUS_COMPLETE, back.error
    assert engine.snapshots == [(sa.SUSPEND_MODE_DISCARD, ["kv_cache"])]
    assert engine.restores == [["kv_cache"]], "the restore carries the request's tags too"


def test_get_operation_names_the_method_used(client: SnapshotAgentClient, engine: Engine) -> None:
    op_id = client.snapshot("engine", "g")
    assert client.wait_for_operation(op_id, 0.01).status == sa.OPERATION_STATUS_COMPLETE
    assert _method(client, op_id) == "app"


def test_configs_the_node_cannot_serve_are_refused_naming_what_it_serves(
    client: SnapshotAgentClient, engine: Engine
) -> None:
    cases = {
        "direct_memory": sa.BackendConfig(direct_memory=sa.DirectMemoryBackendConfig()),
        "memory_regions": sa.BackendConfig(memory_regions=sa.MemoryRegionsBackendConfig()),
    }
    for kind, config in cases.items():
        err = _refused(lambda c=config: client.snapshot("engine", "g", c))
        assert err.code() == grpc.StatusCode.UNIMPLEMENTED, (kind, err.details())
        assert kind in err.details() and "app" in err.details(), err.details()
    own = sa.BackendConfig(cuda=sa.CudaBackendConfig(explicit_target=sa.ProcessTarget(pids=[])))
    own.cuda.explicit_target.pids.append(os.getpid())
    err = _refused(lambda: client.snapshot("engine", "g", own))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err.details()
    assert "cuda" in err.details() and "app" in err.details(), err.details()
    with socket.create_server(("127.0.0.1", 0)) as listener:  # the job's own engine's port
        url = f"127.0.0.1:{listener.getsockname()[1]}"
        served = sa.AppEndpointConfig(app=sa.APP_VLLM, endpoints=[url])
        err = _refused(
            lambda: client.snapshot("engine", "g", sa.BackendConfig(app_endpoint=served))
        )
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err.details()
    assert "endpoint" in err.details() and "app" in err.details(), err.details()
    assert engine.snapshots == [], "nothing else ran in its place"
    assert sa.JobState.Name(client.status().job_statuses[0].state) == "JOB_STATE_RUNNING"


def test_a_checkpoint_of_another_jobs_processes_is_denied(
    client: SnapshotAgentClient, engine: Engine
) -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        config = sa.BackendConfig(cuda=sa.CudaBackendConfig())
        config.cuda.explicit_target.pids.extend([os.getpid(), other.pid])
        err = _refused(lambda: client.snapshot("engine", "g", config))
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED, err.details()
        assert str(other.pid) in err.details()
        assert engine.snapshots == []
    finally:
        other.kill()
        other.wait(10)

"""In Kubernetes a cuda Snapshot may name only its own pod's processes: llm-d's API carries no
credentials, so another pod's PIDs are PERMISSION_DENIED before anything moves."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from agent.parking.setup import ParkingOptions
from baton._pb import snapshot_agent_pb2 as sa
from tests.agent.server.llmd.llmd_client import SnapshotAgentClient
from tests.agent.server.llmd.test_pods import MINE, OTHER, fake_proc, joined, labelled_pod
from tests.harness.agent import AgentRunner
from tests.harness.fakeapi import FakeApiServer

NEIGHBOUR_PID = 4_000_000
"""A process of the other pod, as the agent's /proc shows it (not a real PID here)."""


def test_naming_another_pods_processes_is_denied(workdir: str, tmp_path: Path) -> None:
    proc = fake_proc(tmp_path / "proc")
    neighbour = proc / str(NEIGHBOUR_PID)
    neighbour.mkdir()
    (neighbour / "cgroup").write_text(f"0::/kubepods/burstable/pod{OTHER}/def\n")
    with FakeApiServer() as api:
        api.put_object(labelled_pod("trainer-a", MINE, "job-a", "trainers"))
        api.put_object(labelled_pod("trainer-b", OTHER, "job-b", "trainers"))
        runner = AgentRunner(
            workdir,
            node_name="node-1",
            kubeconfig=str(api.kubeconfig_path(tmp_path)),
            proc_root=str(proc),
            llmd_listen="127.0.0.1:0",
            parking=ParkingOptions(backend="app", fake_gpus="1x1024"),
        ).start()
        client = SnapshotAgentClient(f"127.0.0.1:{runner.llmd_port}")
        try:
            for pod in ("team/trainer-a", "team/trainer-b"):
                runner.wait_event(joined(pod))
            config = sa.BackendConfig(cuda=sa.CudaBackendConfig())
            config.cuda.explicit_target.pids.append(NEIGHBOUR_PID)
            with pytest.raises(grpc.RpcError) as denied:
                client.snapshot("job-a", "trainers", config)
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert str(NEIGHBOUR_PID) in str(denied.value.details())
            assert "job-a" in str(denied.value.details())
            with pytest.raises(grpc.RpcError) as unserved:  # its own processes: no cuda here
                own = sa.BackendConfig(cuda=sa.CudaBackendConfig())
                own.cuda.explicit_target.pids.extend(int(p.name) for p in proc.glob("[0-9]*"))
                own.cuda.explicit_target.pids.remove(NEIGHBOUR_PID)
                client.snapshot("job-a", "trainers", own)
            assert unserved.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "cuda" in str(unserved.value.details())
        finally:
            client.close()
            runner.stop()

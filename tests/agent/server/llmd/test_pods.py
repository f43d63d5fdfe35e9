"""In Kubernetes: llm-d groups and jobs come from the pods' `timeslice.io/*` labels, and only a
pod's own processes may act for its job."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.core.events import Event
from baton.contract import names
from tests.agent.server.llmd.llmd_client import TimeSliceOrchestratorClient
from tests.harness.agent import AgentRunner
from tests.harness.fakeapi import FakeApiServer

MINE = "6f1c2a3b-4d5e-4f60-8a9b-0c1d2e3f4a5b"
OTHER = "11111111-2222-4333-8444-555555555555"


def labelled_pod(name: str, uid: str, job: str, group: str) -> dict[str, Any]:
    labels = {names.LABEL_LLMD_JOB: job, names.LABEL_LLMD_GROUP: group, "app": "rl"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "team",
            "uid": uid,
            "labels": labels,
            "annotations": {names.ANNOTATION_ASSIGNED_GPUS: "GPU-0"},
        },
        "spec": {"nodeName": "node-1", "containers": [{"name": "main", "image": "rl"}]},
        "status": {"phase": "Running"},
    }


def joined(tenant_id: str) -> Callable[[Event], bool]:
    return lambda e: e.kind == "tenant_joined" and e.tenant_id == tenant_id


def fake_proc(root: Path) -> Path:
    """A /proc where this test's process runs in the pod `MINE` (sockets and fds are real)."""
    me = root / str(os.getpid())
    me.mkdir(parents=True)
    (me / "cgroup").write_text(f"0::/kubepods/burstable/pod{MINE}/abc\n")
    (me / "fd").symlink_to(f"/proc/{os.getpid()}/fd")
    (me / "ns").symlink_to(f"/proc/{os.getpid()}/ns")
    (root / "net").symlink_to("/proc/self/net")
    return root


def pods_agent(workdir: str, api: FakeApiServer, tmp_path: Path, proc: Path) -> AgentRunner:
    """An agent on node-1 serving llm-d's API, its pods from `api`, its /proc `proc` (started)."""
    return AgentRunner(
        workdir,
        node_name="node-1",
        kubeconfig=str(api.kubeconfig_path(tmp_path)),
        proc_root=str(proc),
        llmd_listen="127.0.0.1:0",
    ).start()


def test_groups_and_jobs_from_pod_labels(workdir: str, tmp_path: Path) -> None:
    proc = fake_proc(tmp_path / "proc")
    with FakeApiServer() as api:
        api.put_object(labelled_pod("trainer-a", MINE, "job-a", "trainers"))
        api.put_object(labelled_pod("trainer-b", OTHER, "job-b", "trainers"))
        runner = pods_agent(workdir, api, tmp_path, proc)
        client = TimeSliceOrchestratorClient(f"127.0.0.1:{runner.llmd_port}", group_id="trainers")
        try:
            for pod in ("team/trainer-a", "team/trainer-b"):
                runner.wait_event(joined(pod))
            assert client.list_groups() == ["trainers"]
            assert client.acquire(job_id="job-a", timeout_sec=5)[0]
            status = client.get_status()
            assert status.group.locking_job == "job-a"
            assert {s.job_id for s in status.agent_job_states} == {"job-a", "job-b"}
            assert runner.status()["gpus"]["GPU-0"]["holder"] == "team/trainer-a"
            with pytest.raises(grpc.RpcError) as denied:
                client.acquire(job_id="job-b", timeout_sec=5)
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "only its own processes" in str(denied.value.details())
            assert client.release(job_id="job-a") == (True, 0, True)
        finally:
            client.close()
            runner.stop()

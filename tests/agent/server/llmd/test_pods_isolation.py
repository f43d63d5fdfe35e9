"""In Kubernetes a pod's processes act for their own pod's llm-d job only: no other job id, so
not a job of their own making on another pod's group, nor another namespace's pod that shares
their job id; and they see other namespaces' jobs counted, not named."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.agent.server.llmd.llmd_client import (
    SnapshotAgentClient,
    TimeSliceOrchestratorClient,
    register_workload,
)
from tests.agent.server.llmd.test_pods import (
    MINE,
    OTHER,
    fake_proc,
    joined,
    labelled_pod,
    pods_agent,
)
from tests.harness.fakeapi import FakeApiServer


def pod_in(namespace: str, pod: dict[str, Any], gpu: str) -> dict[str, Any]:
    pod["metadata"]["namespace"] = namespace
    pod["metadata"]["annotations"] = {**pod["metadata"]["annotations"]}
    pod["metadata"]["annotations"]["baton.dev/assigned-gpus"] = gpu
    return pod


def test_a_pod_cannot_make_up_a_job_on_another_pods_group(workdir: str, tmp_path: Path) -> None:
    proc = fake_proc(tmp_path / "proc")  # this test's process runs in the pod MINE
    with FakeApiServer() as api:
        api.put_object(pod_in("ours", labelled_pod("mine", MINE, "job-a", "ours"), "GPU-1"))
        api.put_object(pod_in("theirs", labelled_pod("victim", OTHER, "job-b", "rl"), "GPU-0"))
        runner = pods_agent(workdir, api, tmp_path, proc)
        client = TimeSliceOrchestratorClient(f"127.0.0.1:{runner.llmd_port}")
        try:
            for pod in ("ours/mine", "theirs/victim"):
                runner.wait_event(joined(pod))
            with pytest.raises(grpc.RpcError) as denied:
                client.acquire(job_id="made-up", group_id="rl", timeout_sec=5)
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "own pod" in str(denied.value.details())
            assert runner.status()["gpus"]["GPU-0"]["holder"] is None
            assert "llmd/made-up" not in runner.status()["tenants"]
        finally:
            client.close()
            runner.stop()


def test_a_job_id_another_namespace_uses_too_is_still_the_pods_own(
    workdir: str, tmp_path: Path
) -> None:
    proc = fake_proc(tmp_path / "proc")  # this test's process runs in the pod MINE
    with FakeApiServer() as api:  # the other namespace's pod is listed first (key order)
        api.put_object(pod_in("analytics", labelled_pod("trainer", OTHER, "train", "rl"), "GPU-0"))
        api.put_object(pod_in("ours", labelled_pod("trainer", MINE, "train", "rl"), "GPU-1"))
        runner = pods_agent(workdir, api, tmp_path, proc)
        client = TimeSliceOrchestratorClient(f"127.0.0.1:{runner.llmd_port}", "train", "rl")
        try:
            for pod in ("analytics/trainer", "ours/trainer"):
                runner.wait_event(joined(pod))
            assert client.acquire(timeout_sec=5)[0]
            gpus = runner.status()["gpus"]
            assert gpus["GPU-1"]["holder"] == "ours/trainer"
            assert gpus["GPU-0"]["holder"] is None
            assert client.release()[0]
            assert runner.status()["gpus"]["GPU-1"]["holder"] is None
        finally:
            client.close()
            runner.stop()


def test_a_pod_sees_no_job_or_group_of_another_namespace_named(
    workdir: str, tmp_path: Path
) -> None:
    proc = fake_proc(tmp_path / "proc")  # this test's process runs in the pod MINE
    third = "99999999-2222-4333-8444-555555555555"
    with FakeApiServer() as api:
        api.put_object(pod_in("ours", labelled_pod("mine", MINE, "job-a", "shared"), "GPU-1"))
        api.put_object(pod_in("theirs", labelled_pod("victim", OTHER, "job-b", "shared"), "GPU-0"))
        api.put_object(pod_in("theirs", labelled_pod("hidden", third, "job-c", "secret"), "GPU-0"))
        runner = pods_agent(workdir, api, tmp_path, proc)
        client = TimeSliceOrchestratorClient(f"127.0.0.1:{runner.llmd_port}", "job-a", "shared")
        agent = SnapshotAgentClient(f"127.0.0.1:{runner.llmd_port}")
        try:
            for pod in ("ours/mine", "theirs/victim", "theirs/hidden"):
                runner.wait_event(joined(pod))
            assert [s.job_id for s in client.get_status().agent_job_states] == ["job-a"]
            assert [j.job_id for j in agent.status().job_statuses] == ["job-a"]
            assert client.list_groups() == ["shared"]  # "secret" is only theirs' pods' label
            with pytest.raises(grpc.RpcError) as hidden:
                client.get_status("secret")
            assert hidden.value.code() == grpc.StatusCode.NOT_FOUND
            assert client.acquire(timeout_sec=5)[0]
            status = client.get_status()
            assert (status.group.locking_job, status.group.loaded_job) == ("job-a", "job-a")
            assert client.release()[0]
        finally:
            agent.close()
            client.close()
            runner.stop()


def test_a_pods_unknown_group_or_job_is_refused_naming_only_groups_it_may_see(
    workdir: str, tmp_path: Path
) -> None:
    proc = fake_proc(tmp_path / "proc")  # this test's process runs in the pod MINE
    with FakeApiServer() as api:
        api.put_object(pod_in("ours", labelled_pod("mine", MINE, "job-a", "shared"), "GPU-1"))
        api.put_object(pod_in("theirs", labelled_pod("hidden", OTHER, "job-c", "secret"), "GPU-0"))
        runner = pods_agent(workdir, api, tmp_path, proc)
        endpoint = f"127.0.0.1:{runner.llmd_port}"
        client = TimeSliceOrchestratorClient(endpoint, "job-a")
        agent = SnapshotAgentClient(endpoint)
        try:
            for pod in ("ours/mine", "theirs/hidden"):
                runner.wait_event(joined(pod))
            unknown_job = register_workload(endpoint, "job-x")  # no group: must be known
            refusals = []
            for call in (
                lambda: client.get_status("nope"),
                lambda: client.get_status("secret"),
                lambda: client.acquire(group_id="nope", timeout_sec=5),
                lambda: client.release(group_id="nope"),
                lambda: agent.snapshot("job-a", "nope"),
            ):
                with pytest.raises(grpc.RpcError) as refused:
                    call()
                refusals.append(refused.value)
            assert unknown_job.ended(5) and unknown_job.error is not None
            unknown_job.close()
            refusals.append(unknown_job.error)
            for refusal in refusals:
                assert refusal.code() == grpc.StatusCode.NOT_FOUND, refusal.details()
                assert "secret" not in str(refusal.details()).replace("'secret'", "")
            # Theirs-only "secret" reads as a group that is not there.
            for refusal, asked in zip(refusals, ("nope", "secret"), strict=False):
                assert refusal.details() == f"no group {asked!r} on this node (groups: shared)"
        finally:
            agent.close()
            client.close()
            runner.stop()


def test_a_pods_errors_name_no_job_or_pod_of_another_namespace(
    workdir: str, tmp_path: Path
) -> None:
    proc = fake_proc(tmp_path / "proc")  # this test's process runs in the pod MINE...
    cgroup = proc / str(os.getpid()) / "cgroup"
    as_pod = {uid: f"0::/kubepods/burstable/pod{uid}/abc\n" for uid in (MINE, OTHER)}
    with FakeApiServer() as api:  # both pods on GPU-1, in group "shared"
        api.put_object(pod_in("ours", labelled_pod("mine", MINE, "job-a", "shared"), "GPU-1"))
        api.put_object(pod_in("theirs", labelled_pod("victim", OTHER, "job-b", "shared"), "GPU-1"))
        runner = pods_agent(workdir, api, tmp_path, proc)
        endpoint = f"127.0.0.1:{runner.llmd_port}"
        theirs = TimeSliceOrchestratorClient(endpoint, "job-b", "shared")
        ours = TimeSliceOrchestratorClient(endpoint, "job-a", "shared")
        try:
            for pod in ("ours/mine", "theirs/victim"):
                runner.wait_event(joined(pod))
            cgroup.write_text(as_pod[OTHER])  # ...and, for this call, in theirs/victim
            assert theirs.acquire(timeout_sec=5)[0]
            cgroup.write_text(as_pod[MINE])
            refusals = []
            for call in (
                lambda: ours.acquire(timeout_sec=1),  # theirs/victim holds GPU-1
                lambda: ours.release(),  # a turn it does not hold
                lambda: ours.acquire(job_id="job-b", timeout_sec=5),  # not its pod's job
            ):
                with pytest.raises(grpc.RpcError) as refused:
                    call()
                refusals.append(refused.value)
            codes = [r.code() for r in refusals]
            assert codes == [
                grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.PERMISSION_DENIED,
                grpc.StatusCode.PERMISSION_DENIED,
            ], [r.details() for r in refusals]
            for refusal in refusals:
                details = str(refusal.details()).replace("job 'job-b'", "")  # its own word
                assert "theirs" not in details and "victim" not in details, details
                assert "job-b" not in details, details
            assert "behind holder a job of another namespace" in refusals[0].details()
            assert "(held by a job of another namespace)" in refusals[1].details()
            assert "is a pod of another namespace" in refusals[2].details()
        finally:
            cgroup.write_text(as_pod[OTHER])
            with contextlib.suppress(grpc.RpcError):  # (its acquire may be what failed)
                theirs.release()
            ours.close()
            theirs.close()
            runner.stop()

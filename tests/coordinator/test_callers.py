"""Who calls the coordinator's llm-d API once the caller's pod is gone (`coordinator.callers`),
against a real API server and a `baton coordinator` process: a pod's address given to a pod of
another namespace identifies that namespace from then on, not the one of the pod before it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from baton._pb import timeslice_orchestrator_pb2 as ts
from baton._pb import timeslice_orchestrator_pb2_grpc as ts_grpc
from baton.contract.names import LABEL_JOB
from commands.localnode.controlplane import ControlPlane
from commands.localnode.procs import LocalNodeError, wait_for
from coordinator.callers import LEAVING_TTL_S, PodCallers
from tests.coordinator.deployed import CoordinatorProcess, leader_of

OWNER, INTRUDER = "callers-owner", "callers-intruder"
LOOPBACK = "127.0.0.1"  # the address the coordinator sees every call of this test come from


def deleted(core: Any, name: str) -> None:
    core.delete_namespaced_pod(name, OWNER, grace_period_seconds=0)


def terminating(core: Any, name: str) -> None:
    """Deleted with a grace period: its pod stays listed, in deletion, until its kubelet (none
    here) says its containers stopped; the network may free its address before that."""
    core.delete_namespaced_pod(name, OWNER, grace_period_seconds=300)


def finished(core: Any, name: str) -> None:
    """Succeeded but still listed: the network has its address back (restartPolicy Never)."""
    core.patch_namespaced_pod_status(name, OWNER, {"status": {"phase": "Succeeded"}})


@pytest.mark.parametrize(
    ("caller_labels", "ended"),
    [
        ({LABEL_JOB: "rl"}, deleted),
        ({LABEL_JOB: "rl"}, finished),
        ({LABEL_JOB: "rl"}, terminating),
        ({}, deleted),
        ({}, terminating),
    ],
    ids=[
        "job-pod-deleted",
        "job-pod-finished",
        "job-pod-terminating",
        "other-pod-deleted",
        "other-pod-terminating",
    ],
)
def test_a_callers_address_given_to_a_pod_of_another_namespace_drives_none_of_the_old_jobs(
    control_plane: ControlPlane,
    core: Any,
    tmp_path: Path,
    caller_labels: dict[str, str],
    ended: Callable[[Any, str], None],
) -> None:
    """The caller is asked for at once after its pod ended: within the 30 s it used to be
    remembered, the intruder at its address drove (and saw) the owner's jobs."""
    for namespace in (OWNER, INTRUDER):
        with contextlib.suppress(Exception):  # made by an earlier case
            core.create_namespace({"metadata": {"name": namespace}})
            core.create_namespaced_service_account(namespace, {"metadata": {"name": "default"}})
    (tmp_path / "token").write_text("t" * 32)
    pod_at(core, OWNER, "rl-b", {LABEL_JOB: "rl"}, ip="")  # the job lives on without the caller
    pod_at(core, OWNER, "caller", caller_labels, LOOPBACK, node="gone")  # deleted gracefully
    coordinator = CoordinatorProcess(control_plane, tmp_path, "callers", "callers")
    coordinator.process.start()
    try:
        leader_of([coordinator])
        with grpc.insecure_channel(coordinator.address) as channel:
            stub = ts_grpc.TimeSliceOrchestratorServiceStub(channel)

            def answer() -> tuple[grpc.StatusCode, str]:
                with pytest.raises(grpc.RpcError) as refused:
                    stub.Acquire(ts.AcquireRequest(job_id="rl"), timeout=10)
                return refused.value.code(), str(refused.value.details())

            def served() -> bool | None:  # its job's nodes have no agent, so it hears why
                code, details = answer()
                return (code == grpc.StatusCode.FAILED_PRECONDITION and OWNER in details) or None

            wait_for("the owner's caller served", served, 20)
            ended(core, "caller")
            pod_at(core, INTRUDER, "intruder", {}, LOOPBACK)
            denied = (
                grpc.StatusCode.PERMISSION_DENIED,
                f"job 'rl' is in namespace {OWNER}: a caller from namespace {INTRUDER} may drive "
                "only its own namespace's jobs",
            )
            last: list[tuple[grpc.StatusCode, str]] = []

            def refused() -> bool | None:
                last[:] = [answer()]
                return last[0] == denied or None

            try:
                wait_for("the intruder refused", refused, 10)  # well within the old 30 s
            except LocalNodeError:
                pytest.fail(f"the intruder at the owner's address was answered {last}")
    finally:
        coordinator.process.stop()
        for namespace, name in ((OWNER, "caller"), (OWNER, "rl-b"), (INTRUDER, "intruder")):
            with contextlib.suppress(Exception):
                core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)


def pod_at(
    core: Any, namespace: str, name: str, labels: dict[str, str], ip: str, node: str = ""
) -> None:
    """A running pod (bound to `node`, if any) whose status says it has `ip`, as a kubelet
    writes."""
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "registry.invalid/driver:1"}]}
    body = {"metadata": {"name": name, "labels": labels}, "spec": spec}
    if node:
        spec["nodeName"] = node
    core.create_namespaced_pod(namespace, body)
    addresses = {"podIP": ip, "podIPs": [{"ip": ip}]} if ip else {}
    core.patch_namespaced_pod_status(name, namespace, {"status": {"phase": "Running", **addresses}})


def test_a_job_pods_address_is_asked_for_once_until_its_watch_sees_it_end(
    control_plane: ControlPlane, core: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The common caller (a job pod) costs the API server one list, not one a call; any other
    pod is asked for on every call, as nothing would tell when its address goes to another."""
    from baton.contract.kube import load_api_client

    for namespace in (OWNER, INTRUDER):
        with contextlib.suppress(Exception):  # made by another test
            core.create_namespace({"metadata": {"name": namespace}})
            core.create_namespaced_service_account(namespace, {"metadata": {"name": "default"}})
    pod_at(core, OWNER, "counted", {LABEL_JOB: "rl"}, "10.9.0.1")
    pod_at(core, OWNER, "plain", {}, "10.9.0.2")
    callers = PodCallers(load_api_client(str(control_plane.admin_kubeconfig)))
    lists = []
    listing = callers._core.list_pod_for_all_namespaces

    def counted(**kwargs: Any) -> Any:
        lists.append(kwargs["field_selector"])
        return listing(**kwargs)

    monkeypatch.setattr(callers._core, "list_pod_for_all_namespaces", counted)

    async def ask(ip: str) -> str | None:
        return await callers.namespace(f"ipv4:{ip}:4431")

    try:
        assert [asyncio.run(ask("10.9.0.1")) for _ in range(3)] == [OWNER] * 3
        assert [asyncio.run(ask("10.9.0.2")) for _ in range(2)] == [OWNER] * 2
        assert lists == ["status.podIP=10.9.0.1"] + ["status.podIP=10.9.0.2"] * 2
        pod = core.read_namespaced_pod("counted", OWNER).to_dict()
        callers.saw({"metadata": pod["metadata"], "status": {"podIP": "10.9.0.1"}}, gone=False)
        assert asyncio.run(ask("10.9.0.1")) == OWNER and len(lists) == 3  # still the same pod
        core.delete_namespaced_pod("counted", OWNER, grace_period_seconds=0)
        callers.saw({"metadata": pod["metadata"], "status": {"podIP": "10.9.0.1"}}, gone=True)
        assert asyncio.run(ask("10.9.0.1")) is None and len(lists) == 4
    finally:
        for name in ("counted", "plain"):
            with contextlib.suppress(Exception):
                core.delete_namespaced_pod(name, OWNER, grace_period_seconds=0)


def test_a_pod_in_its_grace_period_is_the_caller_of_a_yield_only(
    control_plane: ControlPlane, core: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod in deletion (a SIGTERM handler giving its job's turn back) is the caller of a Yield
    from its address, not of anything else; it is asked for again after `LEAVING_TTL_S`, not on
    every Yield, and a live pod given its address is the caller from then on."""
    from baton.contract.kube import load_api_client

    for namespace in (OWNER, INTRUDER):
        with contextlib.suppress(Exception):  # made by another test
            core.create_namespace({"metadata": {"name": namespace}})
            core.create_namespaced_service_account(namespace, {"metadata": {"name": "default"}})
    pod_at(core, OWNER, "leaving", {LABEL_JOB: "rl"}, "10.9.0.3", node="gone")
    now = [0.0]
    callers = PodCallers(load_api_client(str(control_plane.admin_kubeconfig)), lambda: now[0])
    lists: list[str] = []
    listing = callers._core.list_pod_for_all_namespaces

    def counted(**kwargs: Any) -> Any:
        lists.append(kwargs["field_selector"])
        return listing(**kwargs)

    monkeypatch.setattr(callers._core, "list_pod_for_all_namespaces", counted)

    def ask(ending: bool) -> str | None:
        return asyncio.run(callers.namespace("ipv4:10.9.0.3:4431", ending))

    try:
        assert ask(False) == OWNER and len(lists) == 1
        pod = core.read_namespaced_pod("leaving", OWNER).to_dict()
        terminating(core, "leaving")
        callers.saw({"metadata": {**pod["metadata"], "deletionTimestamp": "now"}}, gone=False)
        assert ask(False) is None and len(lists) == 2  # its Acquire: nobody's
        assert [ask(True), ask(True), ask(False)] == [OWNER, OWNER, None]
        assert len(lists) == 2  # remembered: the Yields cost the API server nothing
        now[0] += LEAVING_TTL_S
        assert ask(True) == OWNER and len(lists) == 3  # asked again, still in deletion
        pod_at(core, INTRUDER, "next", {}, "10.9.0.3")  # the address given to a live pod
        assert ask(True) == OWNER  # within LEAVING_TTL_S of finding it: the window it has
        now[0] += LEAVING_TTL_S
        assert ask(True) == INTRUDER and ask(False) == INTRUDER
    finally:
        for namespace, name in ((OWNER, "leaving"), (INTRUDER, "next")):
            with contextlib.suppress(Exception):
                core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)

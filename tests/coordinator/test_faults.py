"""What a job's turn does when a part of it goes away, against a real API server with agent
and coordinator processes: a member pod deleted during its turn, a member node's agent gone;
and how the coordinator tells who calls (a pod's address, looked up in the API)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from commands.localnode.controlplane import ControlPlane
from commands.localnode.procs import wait_for
from coordinator.callers import PodCallers
from tests.agent.server.llmd.llmd_client import TimeSliceOrchestratorClient
from tests.coordinator.deployed import (
    TEAM,
    CoordinatorProcess,
    holders_of,
    leader_of,
    members_known,
    settle,
)
from tests.coordinator.nodes import agent_nodes, job_pod


def test_a_member_pod_deleted_during_its_turn_frees_its_node_and_the_job_goes_on_without_it(
    control_plane: ControlPlane, core: Any, tmp_path: Path
) -> None:
    with agent_nodes(control_plane, tmp_path, ["d1", "d2"]) as nodes:
        d1, d2 = nodes
        for pod, node, job in (("dl-a", d1, "dl"), ("dl-b", d2, "dl"), ("ot-a", d1, "ot")):
            job_pod(core, TEAM, pod, node, job)
        members_known(nodes, {"d1": {"team/dl-a", "team/ot-a"}, "d2": {"team/dl-b"}})
        coordinator = CoordinatorProcess(control_plane, tmp_path, "deleted", "deleted")
        coordinator.process.start()
        try:
            leader_of([coordinator])
            llmd = TimeSliceOrchestratorClient(coordinator.address)
            assert llmd.acquire("dl", "", timeout_sec=20)[0]
            core.delete_namespaced_pod("dl-b", TEAM, grace_period_seconds=0)
            wait_for("d2's GPU freed", lambda: True if not holders_of(d2) else None, 20)
            assert holders_of(d1) == {d1.gpus[0]: "team/dl-a"}  # the rest keeps its turn
            llmd.release("dl", "")  # ends it on d1, and on d2 where it had already ended
            assert llmd.acquire("ot", "", timeout_sec=20)[0]
            llmd.release("ot", "")
            assert llmd.acquire("dl", "", timeout_sec=20)[0]  # the members that are left
            settle(nodes, {"d1": [("dl", "committed", ("team/dl-a",))], "d2": []})
            llmd.release("dl", "")
            llmd.close()
        finally:
            coordinator.process.stop()


def test_a_member_nodes_agent_gone_fails_the_job_naming_the_node_and_others_go_on(
    control_plane: ControlPlane, core: Any, tmp_path: Path
) -> None:
    with agent_nodes(control_plane, tmp_path, ["g1", "g2"]) as nodes:
        g1, g2 = nodes
        for pod, node, job in (("gn-a", g1, "gn"), ("gn-b", g2, "gn"), ("solo-a", g1, "solo")):
            job_pod(core, TEAM, pod, node, job)
        members_known(nodes, {"g1": {"team/gn-a", "team/solo-a"}, "g2": {"team/gn-b"}})
        coordinator = CoordinatorProcess(control_plane, tmp_path, "gone", "gone")
        coordinator.process.start()
        try:
            leader_of([coordinator])
            g2.stop()
            llmd = TimeSliceOrchestratorClient(coordinator.address)
            began = time.monotonic()
            with pytest.raises(grpc.RpcError) as failed:
                llmd.acquire("gn", "", timeout_sec=15)
            assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "node g2: its agent is unreachable" in str(failed.value.details())
            assert time.monotonic() - began < 15  # told, not left to its deadline
            assert holders_of(g1) == {}  # rolled back on g1
            assert llmd.acquire("solo", "", timeout_sec=20)[0]  # a job of g1 alone goes on
            llmd.release("solo", "")
            llmd.close()
        finally:
            coordinator.process.stop()


def test_a_caller_is_the_namespace_of_the_pod_at_its_address(
    control_plane: ControlPlane, core: Any
) -> None:
    from baton.contract.kube import load_api_client

    job_pod_at(core, "caller", "10.20.30.40")
    callers = PodCallers(load_api_client(str(control_plane.admin_kubeconfig)))

    async def ask() -> tuple[str | None, str | None, str | None]:
        return (
            await callers.namespace("ipv4:10.20.30.40:41234"),
            await callers.namespace("ipv4:10.20.30.41:41234"),  # no pod there
            await callers.namespace("unix:/run/x.sock"),
        )

    assert asyncio.run(ask()) == (TEAM, None, None)


def job_pod_at(core: Any, name: str, ip: str) -> None:
    """A pod of namespace TEAM whose status says it has `ip` (as its kubelet would write)."""
    body = {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/driver:1"}]},
    }
    core.create_namespaced_pod(TEAM, body)
    status = {"status": {"podIP": ip, "podIPs": [{"ip": ip}]}}
    core.patch_namespaced_pod_status(name, TEAM, status)

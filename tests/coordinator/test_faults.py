"""What a job's turn does when a part of it goes away, against a real API server with agent
and coordinator processes: a member pod deleted during its turn, a member node's agent gone,
an agent a new leader cannot reach or learns of only later; and how the coordinator tells who
calls (a pod's address, looked up in the API)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes.client import CoordinationV1Api

from baton.contract.names import ANNOTATION_AGENT_COORDINATION
from commands.localnode.controlplane import ControlPlane
from commands.localnode.procs import wait_for
from coordinator.callers import PodCallers
from tests.agent.server.llmd.llmd_client import TimeSliceOrchestratorClient
from tests.coordinator.deployed import (
    LEASE_NS,
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


def test_an_agent_a_new_leader_could_not_reach_is_settled_once_it_answers(
    control_plane: ControlPlane, core: Any, tmp_path: Path
) -> None:
    with agent_nodes(control_plane, tmp_path, ["u1", "u2"], gpus=3) as nodes:
        u1, u2 = nodes
        for pod, node, job, gpu in (
            ("late-a", u1, "late", 0),
            ("late-b", u2, "late", 0),
            ("lone-a", u2, "lone", 1),
            ("half-a", u1, "half", 2),
            ("half-b", u2, "half", 2),
        ):
            job_pod(core, TEAM, pod, node, job, gpus=(node.gpus[gpu],))
        members_known(
            nodes,
            {
                "u1": {"team/late-a", "team/half-a"},
                "u2": {"team/late-b", "team/lone-a", "team/half-b"},
            },
        )
        # What a leader of epoch 1 left: late decided on both nodes, lone on u2 alone, and half
        # prepared on u2 only (its handover cut short); then u2's agent goes away.
        both = ["u1", "u2"]
        for node in nodes:
            node.hold(1, "t-late", TEAM, "late", both)
        u2.hold(1, "t-lone", TEAM, "lone")
        u2.prepare(1, "t-half", TEAM, "half", both)
        u2.stop()
        leases: Any = CoordinationV1Api(core.api_client)  # released by a leader of epoch 1
        leases.create_namespaced_lease(
            LEASE_NS, {"metadata": {"name": "unsettled"}, "spec": {"leaseTransitions": 1}}
        )
        coordinator = CoordinatorProcess(control_plane, tmp_path, "unsettled", "unsettled")
        coordinator.process.start()
        try:
            leader_of([coordinator])
            seen = coordinator.status()
            assert seen["epoch"] == 2
            assert list(seen.get("unsettled", {})) == ["u2"], seen
            assert "its agent is unreachable" in seen["unsettled"]["u2"]
            assert gpus_held(seen) == {"team/late": [f"u1/{u1.gpus[0]}"]}
            assert "baton_coordinator_agents_unsettled 1.0" in coordinator.metrics()
            u2.start(core)
            wait_for(
                "u2 answering the leader",
                lambda: True if not coordinator.status().get("unsettled", True) else None,
                30,
            )
            assert gpus_held(coordinator.status()) == {
                "team/late": [f"u1/{u1.gpus[0]}", f"u2/{u2.gpus[0]}"],
                "team/lone": [f"u2/{u2.gpus[1]}"],
            }
            settle(  # half rolled back on u2: u1 never had it
                nodes,
                {
                    "u1": [("late", "committed", ("team/late-a",))],
                    "u2": [
                        ("late", "committed", ("team/late-b",)),
                        ("lone", "committed", ("team/lone-a",)),
                    ],
                },
            )
            log = coordinator.process.log.read_text()
            assert "agents not reached (asked again until they answer): u2" in log
            assert "node u2 answered" in log and "turn t-half of job team/half rolled back" in log
            llmd = TimeSliceOrchestratorClient(coordinator.address)
            llmd.release("lone", "")  # the leader holds what u2 reported late
            llmd.release("late", "")  # on both nodes
            settle(nodes, {"u1": [], "u2": []})
            llmd.close()
        finally:
            coordinator.process.stop()


def test_an_agent_the_view_lists_only_after_a_new_leaders_recovery_is_settled(
    control_plane: ControlPlane, core: Any, tmp_path: Path
) -> None:
    """w2's address annotation appears only once the new leader has recovered (as when the
    nodes' watch lists late, or the agent annotates its node later): the leader asks w2 then,
    names it unsettled until it answers, and settles the older leader's turns it holds."""
    with agent_nodes(control_plane, tmp_path, ["w1", "w2"], gpus=2) as nodes:
        w1, w2 = nodes
        for pod, node, job, gpu in (
            ("wide-a", w1, "wide", 0),
            ("wide-b", w2, "wide", 0),
            ("only-a", w2, "only", 1),
        ):
            job_pod(core, TEAM, pod, node, job, gpus=(node.gpus[gpu],))
        members_known(nodes, {"w1": {"team/wide-a"}, "w2": {"team/wide-b", "team/only-a"}})
        # A leader of epoch 1 left wide held on both nodes and only on w2 alone; then w2's agent
        # goes away and its node loses its address.
        for node in nodes:
            node.hold(1, "t-wide", TEAM, "wide", ["w1", "w2"])
        w2.hold(1, "t-only", TEAM, "only")
        w2.stop()
        core.patch_node("w2", agent_address(None))
        leases: Any = CoordinationV1Api(core.api_client)
        leases.create_namespaced_lease(
            LEASE_NS, {"metadata": {"name": "late"}, "spec": {"leaseTransitions": 1}}
        )
        coordinator = CoordinatorProcess(control_plane, tmp_path, "late", "late")
        coordinator.process.start()
        try:
            leader_of([coordinator])  # serving: its recovery asked w1 alone
            seen = coordinator.status()
            assert seen["epoch"] == 2 and not seen["unsettled"], seen
            assert gpus_held(seen) == {"team/wide": [f"w1/{w1.gpus[0]}"]}
            core.patch_node("w2", agent_address(w2.address))  # listed now, its agent not up yet

            def unsettled() -> str | None:
                return coordinator.status()["unsettled"].get("w2") or None

            why = wait_for("the leader naming w2 unsettled", unsettled, 20)
            assert "its agent is unreachable" in why or "not asked for yet" in why, why
            w2.start(core)
            wait_for(
                "w2 answering the leader",
                lambda: True if not coordinator.status()["unsettled"] else None,
                30,
            )
            assert gpus_held(coordinator.status()) == {
                "team/wide": [f"w1/{w1.gpus[0]}", f"w2/{w2.gpus[0]}"],
                "team/only": [f"w2/{w2.gpus[1]}"],
            }
            assert w2.report().epoch == 2  # fenced: the old leader can no longer act there
            settle(
                nodes,
                {
                    "w1": [("wide", "committed", ("team/wide-a",))],
                    "w2": [
                        ("wide", "committed", ("team/wide-b",)),
                        ("only", "committed", ("team/only-a",)),
                    ],
                },
            )
            assert "node w2 answered" in coordinator.process.log.read_text()
            llmd = TimeSliceOrchestratorClient(coordinator.address)
            llmd.release("only", "")  # the leader holds what w2 reported
            llmd.release("wide", "")  # on both nodes
            settle(nodes, {"w1": [], "w2": []})
            llmd.close()
        finally:
            coordinator.process.stop()


def agent_address(address: str | None) -> dict[str, Any]:
    """A patch of a node's agent address annotation (None removes it)."""
    return {"metadata": {"annotations": {ANNOTATION_AGENT_COORDINATION: address}}}


def gpus_held(status: dict[str, Any]) -> dict[str, list[str]]:
    return {key: turn["gpus"] for key, turn in status["held"].items()}


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


def test_a_finished_pod_that_had_the_callers_address_does_not_hide_the_caller(
    control_plane: ControlPlane, core: Any
) -> None:
    from baton.contract.kube import load_api_client

    job_pod_at(core, "finished", "10.20.30.50", phase="Succeeded")  # its IP went back to the pool
    job_pod_at(core, "reused", "10.20.30.50")  # and was given to the pod that calls now
    callers = PodCallers(load_api_client(str(control_plane.admin_kubeconfig)))
    assert asyncio.run(callers.namespace("ipv4:10.20.30.50:41234")) == TEAM


def job_pod_at(core: Any, name: str, ip: str, phase: str = "Running") -> None:
    """A pod of namespace TEAM whose status says it has `ip` (as its kubelet would write)."""
    body = {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/driver:1"}]},
    }
    core.create_namespaced_pod(TEAM, body)
    status = {"status": {"phase": phase, "podIP": ip, "podIPs": [{"ip": ip}]}}
    core.patch_namespaced_pod_status(name, TEAM, status)

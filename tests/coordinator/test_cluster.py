"""The coordinator as deployed, against a real kube-apiserver: `baton coordinator` processes
elected by a Lease, `baton agent` processes standing for two nodes, job pods bound to them
through the API, and llm-d's orchestrator client (`tests/agent/server/llmd/llmd_client.py`)
acquiring and yielding a job's turn through one address."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import grpc
import pytest

from commands.localnode.controlplane import ControlPlane
from commands.localnode.procs import wait_for
from coordinator.agents import NodeFailed
from coordinator.cluster import NODE_GROUP_PREFIX
from tests.agent.server.llmd.llmd_client import TimeSliceOrchestratorClient
from tests.coordinator.deployed import (
    TEAM,
    CoordinatorProcess,
    holders_of,
    leader_of,
    members_known,
    queued,
    settle,
    start_pair,
)
from tests.coordinator.nodes import agent_nodes, job_pod


def test_an_llmd_client_drives_a_two_node_job_through_the_coordinator(
    control_plane: ControlPlane, core: Any, tmp_path: Path
) -> None:
    with agent_nodes(control_plane, tmp_path, ["n1", "n2"]) as nodes:
        n1, n2 = nodes
        for pod, node, job in (
            ("rl-trainer", n1, "rl"),
            ("rl-sampler", n2, "rl"),
            ("sft-a", n1, "sft"),
            ("sft-b", n2, "sft"),
        ):
            job_pod(core, TEAM, pod, node, job)
        members_known(
            nodes,
            {"n1": {"team/rl-trainer", "team/sft-a"}, "n2": {"team/rl-sampler", "team/sft-b"}},
        )
        leader = CoordinatorProcess(control_plane, tmp_path, "coordinator-a", "one-job")
        leader.process.start()
        try:
            wait_for("the coordinator leading", lambda: True if leader.serving() else None, 30)
            llmd = TimeSliceOrchestratorClient(leader.address)
            success, _, _ = llmd.acquire("rl", "", timeout_sec=20)
            assert success
            settle(
                nodes,
                {
                    "n1": [("rl", "committed", ("team/rl-trainer",))],
                    "n2": [("rl", "committed", ("team/rl-sampler",))],
                },
            )
            assert llmd.acquire("rl", "", timeout_sec=5)[0]  # the holder: at once
            seen = leader.status()
            assert (seen["leading"], sorted(seen["held"])) == (True, ["team/rl"])
            assert seen["held"]["team/rl"]["nodes"] == ["n1", "n2"]
            assert "baton_coordinator_job_turns_granted_total 1.0" in leader.metrics()
            got: list[tuple[bool, int, bool]] = []
            other = threading.Thread(target=lambda: got.append(llmd.acquire("sft", "", 20)))
            other.start()
            assert not got  # rl holds both nodes
            status = llmd.release("rl", "")
            other.join(30)
            assert got and got[0][0], "sft's acquire did not return"
            assert status[0]
            settle(
                nodes,
                {
                    "n1": [("sft", "committed", ("team/sft-a",))],
                    "n2": [("sft", "committed", ("team/sft-b",))],
                },
            )
            with pytest.raises(grpc.RpcError) as denied:
                llmd.release("rl", "")
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "held by team/sft" in str(denied.value.details())
            llmd.release("sft", "")
            settle(nodes, {"n1": [], "n2": []})
            llmd.close()
        finally:
            leader.process.stop()


def test_a_leader_killed_during_a_handover_is_replaced_rolling_back_its_half_and_fenced(
    control_plane: ControlPlane, core: Any, tmp_path: Path
) -> None:
    with agent_nodes(control_plane, tmp_path, ["f1", "f2"]) as nodes:
        f1, f2 = nodes
        for pod, node, job in (("blk-a", f2, "blk"), ("bg-a", f1, "bg"), ("bg-b", f2, "bg")):
            job_pod(core, TEAM, pod, node, job)
        members_known(nodes, {"f1": {"team/bg-a"}, "f2": {"team/blk-a", "team/bg-b"}})
        pair = start_pair(control_plane, tmp_path, "failover")
        try:
            first = leader_of(pair)
            epoch = f2.report().epoch
            # blk holds f2 (a turn the leader did not grant, like a node-local tenant's), so bg's
            # handover stops half-way: prepared on f1, waiting on f2, when the leader is killed.
            f2.hold(epoch, "t-blk", TEAM, "blk")
            llmd = TimeSliceOrchestratorClient(first.address)
            failed: list[grpc.RpcError] = []

            def ask() -> None:
                try:
                    llmd.acquire("bg", "", timeout_sec=20)
                except grpc.RpcError as err:
                    failed.append(err)

            asker = threading.Thread(target=ask)
            asker.start()
            wait_for(
                "bg prepared on f1 and waiting on f2",
                lambda: True if queued([f2], {"team/bg-b"}) and holders_of(f1) else None,
                10,
            )
            os.kill(first.process.pid, signal.SIGKILL)
            asker.join(30)
            assert failed and failed[0].code() == grpc.StatusCode.UNAVAILABLE
            second = leader_of(pair)
            assert second is not first
            assert {n.report().epoch for n in nodes} == {epoch + 1}  # recovery raised both
            settle(nodes, {"f1": [], "f2": [("blk", "committed", ("team/blk-a",))]})
            assert not queued([f2], {"team/bg-b"})  # the dead leader's prepare left the queue
            assert holders_of(f1) == {}  # and its half on f1 was rolled back
            with pytest.raises(NodeFailed) as stale:
                f2.release(epoch, "t-blk")  # the dead leader's epoch
            assert f"epoch {epoch} is older than epoch {epoch + 1}" in stale.value.why
            again = TimeSliceOrchestratorClient(second.address)
            again.release("blk", "")  # the new leader holds what the agents reported
            assert again.acquire("bg", "", timeout_sec=20)[0]
            settle(
                nodes,
                {
                    "f1": [("bg", "committed", ("team/bg-a",))],
                    "f2": [("bg", "committed", ("team/bg-b",))],
                },
            )
            again.release("bg", "")
            again.close()
            llmd.close()
        finally:
            for each in pair:
                each.process.stop()


def test_a_turn_held_for_two_groups_is_one_turn_held_in_the_metrics(
    control_plane: ControlPlane, core: Any, tmp_path: Path
) -> None:
    with agent_nodes(control_plane, tmp_path, ["g1", "g2"]) as nodes:
        g1, g2 = nodes
        # g1's GPUs are group "sample"'s too, so the sample turn covers the trainer's group.
        core.patch_node("g1", {"metadata": {"labels": {f"{NODE_GROUP_PREFIX}sample": "true"}}})
        job_pod(core, TEAM, "gr-trainer", g1, "gr", group="train")
        job_pod(core, TEAM, "gr-sampler", g2, "gr", group="sample")
        members_known(nodes, {"g1": {"team/gr-trainer"}, "g2": {"team/gr-sampler"}})
        leader = CoordinatorProcess(control_plane, tmp_path, "coordinator-g", "two-groups")
        llmd = TimeSliceOrchestratorClient(leader.address)
        leader.process.start()
        try:
            wait_for("the coordinator leading", lambda: True if leader.serving() else None, 30)
            assert llmd.acquire("gr", "sample", timeout_sec=20)[0]
            assert llmd.acquire("gr", "train", timeout_sec=5)[0]  # the sample turn covers it
            seen = leader.status()["held"]
            assert sorted(seen) == ["team/gr@sample", "team/gr@train"]
            assert len({each["turn_id"] for each in seen.values()}) == 1, "one turn, two groups"
            held = [
                line for line in leader.metrics().splitlines()
                if "baton_coordinator_job_turns_held " in line and "# TYPE" not in line
            ]  # fmt: skip
            assert held == [
                "# HELP baton_coordinator_job_turns_held Job turns held now, one per turn: a turn "
                "held for several llm-d groups counts once",
                "baton_coordinator_job_turns_held 1.0",
            ]
            llmd.release("gr", "sample")
            llmd.release("gr", "train")
            settle(nodes, {"g1": [], "g2": []})
        finally:
            llmd.close()
            leader.process.stop()

"""Jobs come and go for months, each name seen once: the coordinator's table (each job's usage,
when it was last served on each GPU, its fair virtual time, carried in the Lease) keeps the jobs
that are in the cluster, not every job it ever granted a turn (agents on loopback, real gRPC)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from agent.core.fair import FairShare
from agent.core.leases import LeaseTable
from coordinator.agents import AgentLinks
from coordinator.cluster import ClusterView, Member, Node
from coordinator.jobturn import TurnFailed
from coordinator.recovery import chase, recover
from coordinator.status import CoordinatorMetrics, watch
from coordinator.turns import Arbiter
from tests.coordinator.loopback import TOKEN, LoopbackNode
from tests.coordinator.test_turns import close, run

JOBS = 200


async def two_nodes(tmp_path: Path) -> tuple[list[LoopbackNode], ClusterView]:
    """Agents of nodes n1 and n2 on loopback, one GPU each, and a view listing them."""
    nodes = [
        await LoopbackNode(name, tmp_path / name, (f"GPU-{name}",)).start() for name in ("n1", "n2")
    ]
    view = ClusterView()
    for node in nodes:
        view.nodes[node.name] = Node(node.name, node.address, node.gpus)
    return nodes, view


def test_jobs_deleted_after_their_turns_leave_the_coordinators_table(tmp_path: Path) -> None:
    async def body() -> None:
        nodes, view = await two_nodes(tmp_path)
        new_table = lambda: LeaseTable(clock=time.time, policy=FairShare())  # noqa: E731
        arbiter = Arbiter(view, AgentLinks(TOKEN), new_table, time.time)
        table = arbiter.new_table()
        arbiter.lead(1, table, await recover(view, arbiter.links, table, 1))
        try:
            for i in range(JOBS):
                job = f"job{i}"
                pods = {node: f"team/{job}-{node.name}" for node in nodes}
                for node, pod in pods.items():
                    node.add_pod(pod, node.gpus, job)
                    view.members[pod] = ("team", job, Member(pod, node.name, node.gpus))
                await arbiter.acquire("team", job, "", timeout=5)
                await arbiter.yield_("team", job, "")
                for node, pod in pods.items():  # the job finished and was deleted
                    del view.members[pod]
                    node.service.pod_gone(pod)
                arbiter.prune_joined()  # what the coordinator does as the pods' watch shows it
            table = arbiter.table
            assert table.fair is not None
            assert len(table.usage) < 10, f"{len(table.usage)} jobs' usage kept"
            served = {gpu: len(state.served) for gpu, state in table.gpus.items()}
            assert max(served.values()) < 10, f"last-served times kept per GPU: {served}"
            assert len(table.fair.vtime) < 10, f"{len(table.fair.vtime)} virtual times kept"
            # A job that is still in the cluster keeps its standing.
            live = Member("team/live-n1", "n1", ("GPU-n1",))
            view.members[live.pod] = ("team", "live", live)
            nodes[0].add_pod("team/live-n1", nodes[0].gpus, "live")
            await arbiter.acquire("team", "live", "", timeout=5)
            await arbiter.yield_("team", "live", "")
            arbiter.prune_joined()
            assert "team/live" in table.usage and "team/live" in table.fair.vtime
            assert "team/live" in table.gpu("n1/GPU-n1").served
        finally:
            await close(arbiter)
            for node in nodes:
                await node.stop()

    run(body)


NODES = 200


def test_nodes_deleted_after_their_turns_leave_the_coordinators_table(tmp_path: Path) -> None:
    """A cluster autoscaler adds and removes nodes all day: the state kept per GPU of a node
    gone (the table's entry, when its turn last changed, its fair clocks, which ride in the
    Lease) is forgotten, but not while a turn holds it."""

    async def body() -> None:
        view = ClusterView()
        new_table = lambda: LeaseTable(clock=time.time, policy=FairShare())  # noqa: E731
        arbiter = Arbiter(view, AgentLinks(TOKEN), new_table, time.time)
        table = arbiter.new_table()
        arbiter.lead(1, table, await recover(view, arbiter.links, table, 1))
        held = await LoopbackNode("kept", tmp_path / "kept", ("GPU-kept",)).start()
        try:
            view.nodes["kept"] = Node("kept", held.address, held.gpus)
            arbiter.settling.settled("kept")
            held.add_pod("team/held-kept", held.gpus, "held")
            view.members["team/held-kept"] = (
                "team",
                "held",
                Member("team/held-kept", "kept", held.gpus),
            )
            await arbiter.acquire("team", "held", "", timeout=5)
            del view.nodes["kept"]  # deleted while its turn is held
            for i in range(NODES):
                node = await LoopbackNode(f"n{i}", tmp_path / f"n{i}", (f"GPU-{i}",)).start()
                view.nodes[node.name] = Node(node.name, node.address, node.gpus)
                arbiter.settling.settled(node.name)  # its agent answered (`recovery.chase`)
                pod = f"team/job-{node.name}"
                node.add_pod(pod, node.gpus, "job")
                view.members[pod] = ("team", "job", Member(pod, node.name, node.gpus))
                await arbiter.acquire("team", "job", "", timeout=5)
                await arbiter.yield_("team", "job", "")
                del view.members[pod]  # drained and deleted by the autoscaler
                del view.nodes[node.name]
                await node.stop()
                arbiter.prune_joined()  # what the coordinator does as the watches show it
            table = arbiter.table
            assert table.fair is not None
            assert len(table.gpus) < 10, f"{len(table.gpus)} GPUs kept in the table"
            assert len(arbiter.changed_at) < 10, f"{len(arbiter.changed_at)} GPUs' changes kept"
            assert len(table.fair.vclock) < 10, f"{len(table.fair.vclock)} GPU clocks kept"
            assert "kept/GPU-kept" in table.gpus and "kept/GPU-kept" in arbiter.changed_at
            assert arbiter.settling.heard == set(), arbiter.settling.heard
            await arbiter.yield_("team", "held", "")
            arbiter.prune_joined()
            assert "kept/GPU-kept" not in table.gpus and not table.fair.vclock
        finally:
            await close(arbiter)
            await held.stop()

    run(body)


async def _churned_node(arbiter: Arbiter, view: ClusterView, node: LoopbackNode) -> None:
    """`node` joins the cluster, serves one job turn, and is deleted from it."""
    view.nodes[node.name] = Node(node.name, node.address, node.gpus)
    arbiter.settling.settled(node.name)
    pod = f"team/job-{node.name}"
    node.add_pod(pod, node.gpus, "job")
    view.members[pod] = ("team", "job", Member(pod, node.name, node.gpus))
    await arbiter.acquire("team", "job", "", timeout=5)
    await arbiter.yield_("team", "job", "")
    del view.members[pod]
    del view.nodes[node.name]


def test_the_connections_to_the_agents_of_deleted_nodes_are_closed_and_forgotten(
    tmp_path: Path,
) -> None:
    """A node deleted from the cluster leaves no connection (nor its reading task) open to its
    agent, whether the agent is still up (the Node object deleted before its machine went)
    or already gone; a node still in the cluster keeps its connection."""

    async def body() -> None:
        view = ClusterView()
        arbiter = Arbiter(view, AgentLinks(TOKEN), lambda: LeaseTable(clock=time.time), time.time)
        table = arbiter.new_table()
        arbiter.lead(1, table, await recover(view, arbiter.links, table, 1))
        kept = await LoopbackNode("kept", tmp_path / "kept", ("GPU-kept",)).start()
        up = await LoopbackNode("up", tmp_path / "up", ("GPU-up",)).start()
        down = await LoopbackNode("down", tmp_path / "down", ("GPU-down",)).start()
        try:
            await _churned_node(arbiter, view, kept)
            view.nodes["kept"] = Node("kept", kept.address, kept.gpus)  # it stays
            await _churned_node(arbiter, view, up)  # its agent still runs
            await _churned_node(arbiter, view, down)
            await down.stop()  # its agent went with its machine
            arbiter.prune_joined()  # what the coordinator does as the watches show it
            assert set(arbiter.links._links) == {kept.address}
            while up.server._connections:  # bounded by `run`
                await asyncio.sleep(0.01)
            assert len(kept.server._connections) == 1
        finally:
            await close(arbiter)
            for node in (kept, up, down):
                await node.stop()

    run(body)


def test_the_failure_series_of_a_deleted_node_goes_with_it(tmp_path: Path) -> None:
    """`baton_coordinator_job_turn_failures_total{node}` of a node deleted from the cluster
    leaves /metrics (its spot machine taken back mid-turn, then deleted); a node still in the
    cluster keeps its series."""

    async def body() -> None:
        view = ClusterView()
        arbiter = Arbiter(view, AgentLinks(TOKEN), lambda: LeaseTable(clock=time.time), time.time)
        metrics = CoordinatorMetrics()
        watch(metrics, arbiter)
        table = arbiter.new_table()
        arbiter.lead(1, table, await recover(view, arbiter.links, table, 1))
        nodes = [
            await LoopbackNode(name, tmp_path / name, (f"GPU-{name}",)).start()
            for name in ("kept", "spot")
        ]
        try:
            for node in nodes:
                view.nodes[node.name] = Node(node.name, node.address, node.gpus)
                arbiter.settling.settled(node.name)
                pod = f"team/job-{node.name}"
                node.add_pod(pod, node.gpus, f"job-{node.name}")
                view.members[pod] = ("team", f"job-{node.name}", Member(pod, node.name, node.gpus))
                await node.stop()  # its agent is gone: the job's turn is rolled back
                with pytest.raises(TurnFailed):
                    await arbiter.acquire("team", f"job-{node.name}", "", timeout=5)
            del view.members["team/job-spot"]
            del view.nodes["spot"]
            arbiter.prune_joined()  # what the coordinator does as the watches show it
            series = "baton_coordinator_job_turn_failures_total"
            assert metrics.registry.get_sample_value(series, {"node": "kept"}) == 1.0
            assert metrics.registry.get_sample_value(series, {"node": "spot"}) is None
        finally:
            await close(arbiter)

    run(body)


def test_a_node_deleted_and_listed_again_is_asked_again(tmp_path: Path) -> None:
    """A node the leader heard, deleted and then listed again under its name (a node object
    recreated, an autoscaler reusing a name), is asked for its job turns again, as one listed
    late is; else its jobs would wait for it as unheard for the rest of the term."""

    async def body() -> None:
        nodes, view = await two_nodes(tmp_path)
        arbiter = Arbiter(view, AgentLinks(TOKEN), lambda: LeaseTable(clock=time.time), time.time)
        table = arbiter.new_table()
        found = await recover(view, arbiter.links, table, 1)
        arbiter.lead(1, table, found)
        appeared = asyncio.Event()
        chasing = asyncio.create_task(chase(arbiter, found, 1, appeared))
        try:
            assert arbiter.settling.heard == {"n1", "n2"}
            gone = view.nodes.pop("n2")
            arbiter.prune_joined()  # what the coordinator does as the nodes' watch shows it
            assert arbiter.settling.heard == {"n1"}
            view.nodes["n2"] = gone  # listed again, its agent's address with it
            appeared.set()

            async def heard_again() -> None:
                while "n2" not in arbiter.settling.heard:
                    await asyncio.sleep(0.01)

            await asyncio.wait_for(heard_again(), 10)
        finally:
            chasing.cancel()
            await asyncio.gather(chasing, return_exceptions=True)
            await close(arbiter)
            for node in nodes:
                await node.stop()

    run(body)

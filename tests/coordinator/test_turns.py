"""One turn for a whole job across its nodes: granted together, crossed without deadlock, rolled
back when a node fails, and taken over by a new leader (agents on loopback, real gRPC)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from agent.core.leases import LeaseTable
from baton.contract.annotations import GpuRecord, encode_gpus
from baton.contract.names import ANNOTATION_AGENT_COORDINATION, ANNOTATION_GPUS
from coordinator.agents import AgentLinks, NodeFailed
from coordinator.cluster import ClusterView, Member, Node, NodeStore
from coordinator.jobturn import NotHolder
from coordinator.recovery import chase, recover
from coordinator.turns import Arbiter, NotLeading, TurnFailed
from tests.coordinator.loopback import TOKEN, LoopbackNode, leading, view_of

JOBS = {
    "rl": [("team/rl-trainer", "n1", ""), ("team/rl-sampler", "n2", "")],
    "sft": [("team/sft-a", "n1", ""), ("team/sft-b", "n2", "")],
}


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 30))


@asynccontextmanager
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[list[LoopbackNode], ClusterView]]:
    nodes = [
        await LoopbackNode(name, tmp_path / name, (f"GPU-{name}",)).start() for name in ("n1", "n2")
    ]
    try:
        yield nodes, view_of(nodes, JOBS)
    finally:
        for node in nodes:
            await node.stop()


async def close(arbiter: Arbiter) -> None:
    await arbiter.close()
    await arbiter.links.close()


def check_no_overlap(nodes: list[LoopbackNode], holder: str) -> None:
    """Every GPU of the cluster is held by a pod of `holder`'s job, or by nobody."""
    for node in nodes:
        for gpu, tenant in node.holders().items():
            assert tenant.startswith(f"team/{holder}-"), f"{gpu} on {node.name} held by {tenant}"


def test_a_job_gets_one_turn_on_every_node_and_the_next_job_follows_its_yield(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        async with cluster(tmp_path) as (nodes, view):
            arbiter = await leading(view)
            turn = await arbiter.acquire("team", "rl", "", timeout=5)
            assert sorted(turn.nodes) == ["n1", "n2"]
            assert nodes[0].holders() == {"GPU-n1": "team/rl-trainer"}
            assert nodes[1].holders() == {"GPU-n2": "team/rl-sampler"}
            assert (await arbiter.acquire("team", "rl", "", timeout=5)) is turn  # held: at once
            waiting = asyncio.create_task(arbiter.acquire("team", "sft", "", timeout=5))
            await asyncio.sleep(0.05)
            assert not waiting.done()
            check_no_overlap(nodes, "rl")
            assert await arbiter.yield_("team", "rl", "") == 1
            await waiting
            check_no_overlap(nodes, "sft")
            assert set(nodes[0].holders().values()) == {"team/sft-a"}
            with pytest.raises(NotHolder, match=r"does not hold the turn \(held by team/sft\)"):
                await arbiter.yield_("team", "rl", "")
            await close(arbiter)

    run(body)


def test_two_jobs_crossing_on_two_nodes_alternate_without_deadlock(tmp_path: Path) -> None:
    rounds = 50

    async def body() -> None:
        async with cluster(tmp_path) as (nodes, view):
            arbiter = await leading(view)
            turns: list[str] = []

            async def loop(job: str) -> None:
                for _ in range(rounds):
                    await arbiter.acquire("team", job, "", timeout=10)
                    check_no_overlap(nodes, job)
                    turns.append(job)
                    await asyncio.sleep(0)  # compute
                    await arbiter.yield_("team", job, "")

            await asyncio.gather(loop("rl"), loop("sft"))
            assert sorted(turns) == ["rl"] * rounds + ["sft"] * rounds
            assert not any(node.holders() for node in nodes)
            await close(arbiter)

    run(body)


def test_a_node_that_cannot_prepare_rolls_the_others_back_and_is_named(tmp_path: Path) -> None:
    async def body() -> None:
        async with cluster(tmp_path) as (nodes, view):
            arbiter = await leading(view)
            blocker = nodes[1].add_pod("team/local", ("GPU-n2",))
            await nodes[1].service.acquire(blocker, (), timeout=5)  # n2's GPU stays taken
            arbiter.prepare_timeout_s = 0.2
            with pytest.raises(TurnFailed, match=r"^pod team/rl-sampler on node n2: ") as e:
                await arbiter.acquire("team", "rl", "", timeout=5)
            assert "rolled back on every node; on n2 until its agent answers" in str(e.value)
            assert not nodes[0].holders()  # n1 was rolled back before the waiter was told
            assert not arbiter.held
            await close(arbiter)

    run(body)


def test_an_unreachable_node_fails_the_turn_naming_it(tmp_path: Path) -> None:
    async def body() -> None:
        async with cluster(tmp_path) as (nodes, view):
            arbiter = await leading(view)
            await nodes[1].server.stop(0)
            with pytest.raises(TurnFailed, match="node n2: its agent is unreachable"):
                await arbiter.acquire("team", "rl", "", timeout=5)
            assert not nodes[0].holders()  # rolled back on n1 before the waiter was told
            await close(arbiter)

    run(body)


def test_a_new_leader_keeps_a_committed_turn_and_fences_the_old(tmp_path: Path) -> None:
    async def body() -> None:
        async with cluster(tmp_path) as (nodes, view):
            old = await leading(view, epoch=1)
            held = await old.acquire("team", "rl", "", timeout=5)
            # The old leader's prepare of another job, waiting on n1 behind rl when it is deposed.
            links = AgentLinks(TOKEN)
            extra = nodes[0].add_pod("team/solo", ("GPU-n1",), "solo")
            late = asyncio.create_task(
                links.prepare("n1", nodes[0].address, 1, ("t-solo", "team", "solo", ""), (), 5)
            )
            queue = nodes[0].service.table.waiters
            while extra.tenant_id not in {w.tenant_id for w in queue.values()}:
                await asyncio.sleep(0)
            new = await leading(view, epoch=2)
            assert list(new.held) == ["team/rl"]  # committed on both nodes: decided, so kept
            with pytest.raises(NodeFailed, match="epoch 1 is older than epoch 2"):
                await links.release("n2", nodes[1].address, 1, held.turn_id, "deposed")
            assert await new.yield_("team", "rl", "") == 0
            with pytest.raises(NodeFailed, match="epoch 1 is older than epoch 2"):
                await late  # granted only after the fence rose: given back, never a turn
            assert not any(node.holders() for node in nodes)
            await links.close()
            await close(old)
            await close(new)

    run(body)


def test_a_replica_that_does_not_lead_refuses_and_a_stepped_down_one_tells_its_waiters(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        async with cluster(tmp_path) as (_nodes, view):
            standby = Arbiter(
                view, AgentLinks(TOKEN), lambda: LeaseTable(clock=time.time), time.time
            )
            with pytest.raises(NotLeading, match="not the leader"):
                await standby.acquire("team", "rl", "", timeout=1)
            arbiter = await leading(view)
            await arbiter.acquire("team", "rl", "", timeout=5)
            waiting = asyncio.create_task(arbiter.acquire("team", "sft", "", timeout=5))
            await asyncio.sleep(0.05)
            arbiter.step_down("lost the Lease")
            with pytest.raises(NotLeading, match="stepped down: lost the Lease"):
                await waiting
            await close(arbiter)
            await close(standby)

    run(body)


def test_a_turn_prepared_on_every_node_is_held_by_a_new_leader_and_one_cut_short_is_not(
    tmp_path: Path,
) -> None:
    """Prepared on all its nodes, a turn was decided (its waiter may have been told) even
    with no commit yet; one that a node lacks (a yield cut short) is ended everywhere."""

    async def body() -> None:
        async with cluster(tmp_path) as (nodes, view):
            links = AgentLinks(TOKEN)
            both = ["n1", "n2"]
            for node, pod in zip(nodes, ("team/rl-trainer", "team/rl-sampler"), strict=True):
                turn = ("t-rl", "team", "rl", "")
                await links.prepare(node.name, node.address, 1, turn, (pod,), 5, both)
            new = await leading(view, epoch=2)
            assert list(new.held) == ["team/rl"]
            assert [t.state for t in (await links.report("n1", nodes[0].address, 2)).turns] == [
                "committed"
            ]
            await new.yield_("team", "rl", "")
            # sft's turn on both nodes, then its release reached n1 only before the leader died.
            for node, pod in zip(nodes, ("team/sft-a", "team/sft-b"), strict=True):
                turn = ("t-sft", "team", "sft", "")
                await links.prepare(node.name, node.address, 2, turn, (pod,), 5, both)
            await links.release("n1", nodes[0].address, 2, "t-sft", "yielded")
            newer = await leading(view, epoch=3)
            assert not newer.held
            assert not any(node.holders() for node in nodes)  # ended on n2 too
            await links.close()
            await close(new)
            await close(newer)

    run(body)


def test_a_release_a_node_missed_is_sent_again_until_it_is_heard(tmp_path: Path) -> None:
    async def body() -> None:
        async with cluster(tmp_path) as (nodes, view):
            arbiter = await leading(view)
            arbiter.release_wait_s = 0.2
            await arbiter.acquire("team", "rl", "", timeout=5)
            await nodes[1].server.stop(0)  # n2's agent is away when rl yields
            await arbiter.yield_("team", "rl", "")
            assert nodes[1].holders() == {"GPU-n2": "team/rl-sampler"}
            await nodes[1].restart_server()
            while nodes[1].holders():  # bounded by the test's deadline
                await asyncio.sleep(0.05)
            await close(arbiter)

    run(body)


def test_a_node_that_fails_fails_the_turn_at_once_while_another_still_makes_room(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        async with cluster(tmp_path) as (nodes, view):
            arbiter = await leading(view)
            blocker = nodes[0].add_pod("team/local", ("GPU-n1",))
            await nodes[0].service.acquire(blocker, (), timeout=5)  # n1 would take long
            await nodes[1].server.stop(0)  # and n2 cannot answer
            began = time.monotonic()
            with pytest.raises(TurnFailed, match="node n2: its agent is unreachable"):
                await arbiter.acquire("team", "rl", "", timeout=20)
            assert time.monotonic() - began < 5  # not n1's prepare timeout (60 s)
            queue = nodes[0].service.table.waiters.values()
            while "team/rl-trainer" in {w.tenant_id for w in queue}:  # its prepare goes
                await asyncio.sleep(0.01)
            await close(arbiter)

    run(body)


def test_a_node_that_has_not_answered_the_new_leader_gets_no_turn_planned_until_it_has(
    tmp_path: Path,
) -> None:
    """n2 did not answer the new leader, and still holds solo's turn of the old one: sft, whose
    member is on n2, is not planned there (it waits, and its deadline names n2 and why). Once
    n2 answers, solo's turn is held, and sft follows solo's yield."""

    async def body() -> None:
        async with cluster(tmp_path) as (nodes, view):
            n2 = nodes[1]
            n2.add_pod("team/solo", ("GPU-n2",), "solo")
            view.members["team/solo"] = ("team", "solo", Member("team/solo", "n2", ("GPU-n2",)))
            links = AgentLinks(TOKEN)
            await links.prepare("n2", n2.address, 1, ("t-solo", "team", "solo", ""), (), 5)
            await links.commit("n2", n2.address, 1, "t-solo")
            await n2.server.stop(0)
            arbiter = Arbiter(view, links, lambda: LeaseTable(clock=time.time), time.time)
            table = arbiter.new_table()
            found = await recover(view, links, table, 2)
            arbiter.lead(2, table, found)
            assert not found.held and list(arbiter.settling.unsettled) == ["n2"]
            await n2.restart_server()
            with pytest.raises(TimeoutError, match="node n2 has not reported its job turns"):
                await arbiter.acquire("team", "sft", "", timeout=0.3)
            assert not n2.service.table.waiters  # nothing was prepared on n2
            assert not nodes[0].holders()  # nor on n1
            sft = asyncio.create_task(arbiter.acquire("team", "sft", "", timeout=10))
            await chase(arbiter, found, 2)
            assert not arbiter.settling.unsettled and not found.rolled_back
            assert list(arbiter.held) == ["team/solo"]  # the older turn n2 held is kept
            assert not sft.done()
            await arbiter.yield_("team", "solo", "")
            assert sorted((await sft).nodes) == ["n1", "n2"]
            assert n2.holders() == {"GPU-n2": "team/sft-b"}
            assert [t.job for t in (await links.report("n2", n2.address, 2)).turns] == ["sft"]
            await close(arbiter)

    run(body)


def test_a_node_the_nodes_watch_lists_after_recovery_is_asked_and_its_part_joins_the_turn(
    tmp_path: Path,
) -> None:
    """rl's turn of epoch 1 is on n1 and n2, and the nodes' watch lists n2 only after the new
    leader recovered: the leader asks n2 then (named unsettled while n2 cannot answer), and
    n2's GPU joins the turn it holds."""

    async def body() -> None:
        async with cluster(tmp_path) as (nodes, view):
            links = AgentLinks(TOKEN)
            for node in nodes:
                turn = ("t-rl", "team", "rl", "")
                await links.prepare(node.name, node.address, 1, turn, (), 5, ["n1", "n2"])
                await links.commit(node.name, node.address, 1, "t-rl")
            listed = [node_object(view.nodes[n.name]) for n in nodes]
            del view.nodes["n2"]  # not listed yet
            arbiter = Arbiter(view, links, lambda: LeaseTable(clock=time.time), time.time)
            table = arbiter.new_table()
            found = await recover(view, links, table, 2)
            arbiter.lead(2, table, found)
            assert arbiter.held["team/rl"].resources == ("n1/GPU-n1",)
            assert not arbiter.settling.unsettled
            appeared = asyncio.Event()
            view.on_agents_changed = appeared.set
            chasing = asyncio.create_task(chase(arbiter, found, 2, appeared))
            await nodes[1].server.stop(0)  # and its agent cannot answer yet
            NodeStore(view).replace(listed, "1")
            while "n2" not in arbiter.settling.unsettled:
                await asyncio.sleep(0.01)
            with pytest.raises(TimeoutError, match="node n2 has not reported its job turns"):
                await arbiter.acquire("team", "sft", "", timeout=0.2)  # not planned onto n2
            await nodes[1].restart_server()
            while arbiter.settling.unsettled:
                await asyncio.sleep(0.01)
            assert arbiter.held["team/rl"].resources == ("n1/GPU-n1", "n2/GPU-n2")
            assert (await links.report("n2", nodes[1].address, 0)).epoch == 2
            assert not chasing.done()  # it listens for nodes listed later while leading
            chasing.cancel()
            await close(arbiter)

    run(body)


def test_a_node_that_reported_but_missed_its_roll_back_is_asked_again_and_planned_onto_after(
    tmp_path: Path,
) -> None:
    """sft's turn of epoch 1 was cut short on n1; n2 reports it to the new leader, then goes
    away before the roll-back reaches it: n2 stays unsettled (rl is not planned onto it) and
    is asked again, and settled, once it answers."""

    async def body() -> None:
        async with cluster(tmp_path) as (nodes, view):
            n2, links = nodes[1], AgentLinks(TOKEN)
            for node, pod in zip(nodes, ("team/sft-a", "team/sft-b"), strict=True):
                turn = ("t-sft", "team", "sft", "")
                await links.prepare(node.name, node.address, 1, turn, (pod,), 5, ["n1", "n2"])
            await links.release("n1", nodes[0].address, 1, "t-sft", "yielded")
            release = links.release

            async def away(node: str, address: str, epoch: int, turn_id: str, reason: str) -> bool:
                await n2.server.stop(0)  # gone once it has reported
                return await release(node, address, epoch, turn_id, reason)

            links.release = away  # type: ignore[method-assign]
            arbiter = Arbiter(view, links, lambda: LeaseTable(clock=time.time), time.time)
            found = await recover(view, links, table := arbiter.new_table(), 2)
            links.release = release  # type: ignore[method-assign]
            arbiter.lead(2, table, found)
            with pytest.raises(TimeoutError, match="node n2 has not reported its job turns"):
                await arbiter.acquire("team", "rl", "", timeout=0.2)
            await n2.restart_server()
            await chase(arbiter, found, 2)
            assert not arbiter.settling.unsettled and not n2.holders()
            assert len((await arbiter.acquire("team", "rl", "", timeout=5)).nodes) == 2
            await close(arbiter)

    run(body)


def node_object(node: Node) -> dict[str, object]:
    """The Node object the nodes' watch would list for `node`."""
    gpus = [GpuRecord(uuid, i, "fake", 81920, 4) for i, uuid in enumerate(node.gpus)]
    annotations = {ANNOTATION_GPUS: encode_gpus(gpus), ANNOTATION_AGENT_COORDINATION: node.address}
    return {"metadata": {"name": node.name, "annotations": annotations}}

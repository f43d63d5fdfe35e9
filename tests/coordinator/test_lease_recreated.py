"""A Lease deleted and created again counts from epoch 1 again: a new replica may then lead in the
very epoch the old leader still acts in. The agents obey one leader per epoch (they remember its
identity), and the new one takes the Lease again above it (agents on loopback; the electors
against a real kube-apiserver)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from agent.core.leases import LeaseTable
from baton.contract.kube import load_api_client
from commands.localnode.controlplane import ControlPlane
from coordinator.agents import AgentLinks, NodeFailed
from coordinator.cluster import ClusterView
from coordinator.leader import LeaderElector
from coordinator.recovery import Recovered, chase, recover
from coordinator.turns import Arbiter
from tests.coordinator.loopback import TOKEN, LoopbackNode, leading, view_of

JOBS = {"rl": [("team/rl-trainer", "n1", ""), ("team/rl-sampler", "n2", "")]}
SAME_EPOCH = "epoch 1 is led by coordinator-a here, not by coordinator-b"
WAIT_S = 10.0


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


def test_a_second_leader_in_the_same_epoch_is_refused_and_outranks_the_first(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        async with cluster(tmp_path) as (nodes, view):
            a = await leading(view, epoch=1, holder="coordinator-a")
            held = await a.acquire("team", "rl", "", timeout=5)
            b_links = AgentLinks(TOKEN, holder="coordinator-b")  # the Lease created again
            found = await recover(view, b_links, LeaseTable(clock=time.time), 1)
            assert found.outranked == 1 and not found.held  # b settles nothing in a's epoch
            with pytest.raises(NodeFailed, match=SAME_EPOCH):
                await b_links.release("n1", nodes[0].address, 1, held.turn_id, "b")
            assert nodes[0].holders() == {"GPU-n1": "team/rl-trainer"}  # a's turn stands
            await b_links.close()
            b = await leading(view, epoch=2, holder="coordinator-b")  # above the agents
            assert list(b.held) == ["team/rl"]
            with pytest.raises(NodeFailed, match="epoch 1 is older than epoch 2"):
                await a.links.release("n1", nodes[0].address, 1, held.turn_id, "deposed")
            await close(a)
            await close(b)

    asyncio.run(asyncio.wait_for(body(), 30))


def test_an_agent_chased_that_obeys_another_leader_in_this_epoch_outranks_this_one(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        async with cluster(tmp_path) as (_nodes, view):
            a = await leading(view, epoch=1, holder="coordinator-a")
            links = AgentLinks(TOKEN, holder="coordinator-b")
            b = Arbiter(view, links, lambda: LeaseTable(clock=time.time), time.time)
            outranked: list[int] = []
            found = Recovered(unreachable={"n1": "not reached by recovery"})
            await asyncio.wait_for(chase(b, found, 1, None, outranked.append), WAIT_S)
            assert outranked == [1]
            await close(a)
            await close(b)

    asyncio.run(asyncio.wait_for(body(), 30))


def test_an_agent_that_obeys_another_leader_is_asked_no_more_this_term_and_keeps_its_reason(
    tmp_path: Path,
) -> None:
    """n1, chased, obeys coordinator-a in b's epoch; then n2's agent appears: b asks n2 only,
    and n1 keeps saying why it is unsettled (not "listed after this leader took over")."""

    async def body() -> None:
        async with cluster(tmp_path) as (_nodes, view):
            n2 = view.nodes.pop("n2")  # listed later
            a = await leading(view, epoch=1, holder="coordinator-a")
            b = Arbiter(view, AgentLinks(TOKEN, holder="coordinator-b"), a.new_table, time.time)
            appeared, outranked = asyncio.Event(), list[int]()
            found = Recovered(unreachable={"n1": "not reached by recovery"})
            chasing = asyncio.create_task(chase(b, found, 1, appeared, outranked.append))
            while not outranked:
                await asyncio.sleep(0.01)  # polls, bounded by the test's wait_for
            view.nodes["n2"] = n2  # the nodes' watch lists it now
            appeared.set()
            while "n2" not in b.settling.heard:
                assert not chasing.done(), chasing
                await asyncio.sleep(0.01)
            assert outranked == [1]
            assert "obeys epoch 1 (coordinator-a)" in b.settling.unsettled["n1"]
            chasing.cancel()
            await close(a)
            await close(b)

    asyncio.run(asyncio.wait_for(body(), 30))


def elector(plane: ControlPlane, lease: str, identity: str, **timing: Any) -> LeaderElector:
    api_client = load_api_client(str(plane.admin_kubeconfig))
    made = LeaderElector(api_client, "default", lease, identity, **timing)
    made.start()
    return made


def test_a_lease_deleted_under_a_leader_never_gives_two_leaders_one_epoch(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    """Leader a (epoch 1, first term) reads the Lease only every 40 s; the Lease is deleted and
    replica b, which never read it, creates it in epoch 1 too. The agents still obey a only, and
    b, outranked by their reports, takes the Lease again in epoch 2."""
    from kubernetes import client

    lease = f"recreated-{uuid.uuid4().hex[:10]}"
    slow = {"lease_duration_s": 60, "renew_deadline_s": 50.0, "retry_period_s": 40.0}
    fast = {"lease_duration_s": 3, "renew_deadline_s": 2.0, "retry_period_s": 0.2}
    api_client = load_api_client(str(control_plane.admin_kubeconfig))
    leases: Any = client.CoordinationV1Api(api_client)
    a = elector(control_plane, lease, "coordinator-a", **slow)
    b: LeaderElector | None = None
    try:
        assert a.wait_leading(WAIT_S) and a.epoch == 1
        leases.delete_namespaced_lease(lease, "default", _request_timeout=WAIT_S)
        b = elector(control_plane, lease, "coordinator-b", **fast)
        assert b.wait_leading(WAIT_S) and b.epoch == 1  # two leaders, one epoch
        assert a.is_leader()

        async def body(b: LeaderElector) -> None:
            async with cluster(tmp_path) as (nodes, view):
                old = await leading(view, epoch=a.epoch, holder=a.identity)
                held = await old.acquire("team", "rl", "", timeout=5)
                links = AgentLinks(TOKEN, holder=b.identity)
                found = await recover(view, links, LeaseTable(clock=time.time), b.epoch)
                assert found.outranked == 1
                b.outrank(found.outranked)  # as the daemon does
                deadline = time.monotonic() + WAIT_S
                while b.epoch < 2 and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)  # polls the elector's epoch, bounded
                assert b.epoch == 2 and await asyncio.to_thread(b.wait_leading, WAIT_S)
                new = await leading(view, epoch=b.epoch, holder=b.identity)
                assert list(new.held) == ["team/rl"]
                with pytest.raises(NodeFailed, match="epoch 1 is older than epoch 2"):
                    await old.links.release("n1", nodes[0].address, 1, held.turn_id, "deposed")
                await links.close()
                await close(old)
                await close(new)

        asyncio.run(asyncio.wait_for(body(b), 30))
    finally:
        for each in (a, b):
            if each is not None:
                each.stop(timeout=WAIT_S)
        api_client.close()

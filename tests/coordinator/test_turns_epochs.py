"""A leader the agents' epoch has passed (the Lease recreated, or a newer leader) settles
nothing and takes the Lease again above it, whether the node answers its recovery or later
(agents on loopback, real gRPC)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from agent.core.leases import LeaseTable
from coordinator.agents import AgentLinks
from coordinator.recovery import chase, recover
from coordinator.turns import Arbiter
from tests.coordinator.loopback import TOKEN
from tests.coordinator.test_turns import close, cluster, run


def test_a_leader_whose_epoch_the_agents_have_passed_settles_nothing(tmp_path: Path) -> None:
    async def body() -> None:
        async with cluster(tmp_path) as (nodes, view):
            links = AgentLinks(TOKEN)
            await links.report("n1", nodes[0].address, 5)  # n1 obeys epoch 5
            table = LeaseTable(clock=time.time)
            found = await recover(view, links, table, 2)
            assert found.outranked == 5 and not found.held
            await links.close()

    run(body)


def test_a_node_that_answers_late_with_a_newer_epoch_outranks_the_leader(tmp_path: Path) -> None:
    """The Lease was recreated (this leader counts from epoch 2) while the agents were away:
    n2, which obeys epoch 5, answers only after recovery. The leader is told to take the Lease
    again above 5, and a job with a member on n2 hears why it waits (not that n2 was listed
    late), instead of waiting on n2 for as long as this leader leads."""

    async def body() -> None:
        async with cluster(tmp_path) as (nodes, view):
            n2 = nodes[1]
            links = AgentLinks(TOKEN)
            await links.report("n2", n2.address, 5)  # n2 obeys epoch 5 of the older Lease
            await n2.server.stop(0)
            arbiter = Arbiter(view, links, lambda: LeaseTable(clock=time.time), time.time)
            table = arbiter.new_table()
            found = await recover(view, links, table, 2)
            assert not found.outranked and list(found.unreachable) == ["n2"]
            arbiter.lead(2, table, found)
            await n2.restart_server()
            told: list[int] = []
            await asyncio.wait_for(chase(arbiter, found, 2, outranked=told.append), 10)
            assert told == [5]
            why = arbiter.settling.unsettled["n2"]
            assert "obeys epoch 5 (its leader unnamed), not this leader's 2" in why
            with pytest.raises(TimeoutError, match=r"node n2 .* obeys epoch 5"):
                await arbiter.acquire("team", "sft", "", timeout=0.2)
            assert (await links.report("n2", n2.address, 0)).epoch == 5
            await close(arbiter)

    run(body)

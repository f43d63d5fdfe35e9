"""A job's next turn prepared on a node that never heard its last turn's release (the agent
restarting, a leader change): the older turn ends there and the new one is made, whether its
member still holds the GPU or waits for a revoked turn to be given back, and whether the new
turn is on the older one's group or on another that shares a pod with it; the job's turn on
another group, of other pods, stands (`agent.server.jobturns`)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from agent.node.jobturn_store import JobTurnStore
from tests.agent.server.test_jobturns import node, revoking_node, run
from tests.agent.server.test_jobturns_link import until

UNHEARD = "turn t1 released (the job's turn t2 is being prepared; its release was not heard)"


def test_a_jobs_next_turn_ends_the_one_whose_release_was_not_heard(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        service, turns = node(tmp_path)
        await turns.prepare(1, "t1", "team", "rl", timeout=5)
        turns.commit(1, "t1")
        turn = await turns.prepare(1, "t2", "team", "rl", timeout=5)  # no release of t1 here
        assert list(turns.turns) == ["t2"]
        assert {lease.lease_id for lease in service.table.leases.values()} == set(turn.leases)
        assert [t["turn_id"] for t in JobTurnStore(tmp_path).load_turns()] == ["t2"]
        await service.close()

    with caplog.at_level(logging.WARNING):
        run(body)
    assert [r.getMessage() for r in caplog.records] == [f"job team/rl: {UNHEARD}"]


def test_a_member_waiting_for_its_revoked_turn_joins_the_jobs_next_turn(tmp_path: Path) -> None:
    """The maximum hold revoked the trainer's turn for a node-local pod; the job's next turn
    (t1's release unheard) waits for the GPU and is made once the local pod yields, where its
    member's revoked turn, still waiting to be given back, would have refused it ("already
    waits for GPU-0")."""

    async def body() -> None:
        service, turns = revoking_node(tmp_path)
        await turns.prepare(1, "t1", "team", "rl", timeout=5)
        service.table.max_hold = 60.0
        solo = service.tenants.tenants["team/solo"]
        local = await service.acquire(solo, (), timeout=5)  # the trainer's turn is revoked
        assert [w.tenant_id for w in service.table.waiters.values()] == ["team/trainer"]
        preparing = asyncio.ensure_future(turns.prepare(1, "t2", "team", "rl", timeout=5))
        await until(lambda: "t1" not in turns.turns and bool(service.table.waiters))
        assert not preparing.done()  # the trainer waits for the GPU, in t2's preparation
        service.yield_(solo, local.lease.lease_id)
        turn = await preparing
        assert list(turns.turns) == ["t2"] and turn.members == ("team/trainer",)
        [lease] = service.table.leases.values()
        assert (lease.tenant_id, lease.lease_id) == ("team/trainer", turn.leases[0])
        await service.close()

    run(body)


def test_the_jobs_turn_on_another_group_stands(tmp_path: Path) -> None:
    async def body() -> None:
        service, turns = node(tmp_path)
        await turns.prepare(1, "t1", "team", "rl", 5, pods=["team/trainer"], group="g1")
        await turns.prepare(1, "t2", "team", "rl", 5, pods=["team/sampler"], group="g2")
        assert sorted(turns.turns) == ["t1", "t2"]
        assert len(service.table.leases) == 2
        await service.close()

    run(body)


def test_a_jobs_next_turn_on_a_group_its_unheard_turn_covered_ends_that_turn(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The coordinator granted the job's turn on group g1 out of the turn t1 it held on all its
    pods (it covers g1), and sent t1's release when the last of the two was yielded; the node
    did not hear it. The job's next turn on g1 ends t1 here: the coordinator never prepares a
    job's turn that shares a pod with one it still holds."""

    async def body() -> None:
        service, turns = node(tmp_path)
        await turns.prepare(1, "t1", "team", "rl", timeout=5)
        turns.commit(1, "t1")
        turn = await turns.prepare(1, "t2", "team", "rl", 5, pods=["team/trainer"], group="g1")
        assert list(turns.turns) == ["t2"] and turn.members == ("team/trainer",)
        assert {lease.lease_id for lease in service.table.leases.values()} == set(turn.leases)
        await service.close()

    with caplog.at_level(logging.WARNING):
        run(body)
    assert [r.getMessage() for r in caplog.records] == [f"job team/rl: {UNHEARD}"]

"""A member pod's yield while no coordinator leads (an election): its agent tells the new
leader (or, restarted meanwhile, the next agent does), so the job's turn does not outlive its
last member; a yield that reaches the coordinator after the member asked again is ignored."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agent.core.errors import AcquireTimeout
from agent.server import api_ops
from agent.server.coordinated import CoordinatedTurns
from baton._pb import agent_pb2 as pb
from baton._pb import jobturns_pb2 as pb_jt
from coordinator.recovery import recover
from tests.coordinator.loopback import TOKEN
from tests.coordinator.test_members import acquire, cluster, pod, release, run, until


def heard_leaves(arbiter: Any) -> asyncio.Queue[None]:
    """A queue that gets an item as each member's Leave reaches `arbiter`."""
    leaves = asyncio.Queue[None]()
    leave = arbiter.leave

    async def leaving(*args: Any, **kwargs: Any) -> bool:
        leaves.put_nowait(None)
        return await leave(*args, **kwargs)

    arbiter.leave = leaving
    return leaves


async def yield_unheard(node: Any, arbiter: Any) -> None:
    """The job's only member on `node`, the trainer, takes its turn and yields while no
    coordinator leads (an election): its Leave meets no leader."""
    trainer = pod(node, "rl-trainer")
    mine = await acquire(node.service, trainer)
    leaves = heard_leaves(arbiter)
    arbiter.step_down("the Lease was lost")
    release(node.service, trainer, mine)  # the only member that joined leaves
    await asyncio.wait_for(leaves.get(), 5)


def test_a_members_yield_during_an_election_ends_its_jobs_turn_under_the_new_leader(
    tmp_path: Path,
) -> None:
    """The last member yields while no coordinator leads (its Leave is answered UNAVAILABLE):
    the agent tells the new leader, so the job's turn ends and other jobs go on."""

    async def body() -> None:
        async with cluster(tmp_path) as (n1, n2, arbiter):
            await yield_unheard(n1, arbiter)
            table = arbiter.new_table()
            found = await recover(arbiter.view, arbiter.links, table, 2)
            arbiter.lead(2, table, found)  # a new leader, from the nodes' reports
            granted = await acquire(n1.service, pod(n1, "sft-a"))
            assert granted.tenant_id == "team/sft-a"
            await until(lambda: not n2.holders(), "the job's turn ends on n2")

    run(body)


def test_a_member_whose_acquire_failed_after_the_coordinator_let_it_join_does_not_hold_the_turn(
    tmp_path: Path,
) -> None:
    """The sampler's acquire starts the job's turn; the trainer, which computed in it without
    asking, was revoked on n1 for a node-local pod, so its own acquire times out there after the
    coordinator let it join. It never computes in the turn: the sampler's yield ends it."""

    async def body() -> None:
        async with cluster(tmp_path) as (n1, n2, arbiter):
            trainer, sampler = pod(n1, "rl-trainer"), pod(n2, "rl-sampler")
            solo = n1.add_pod("team/solo", ("GPU-n1",))  # no job: a node-local tenant
            n1.service.table.max_hold = 0.2
            theirs = await acquire(n2.service, sampler)  # the whole job's turn
            n1.service.table.max_hold = 60.0  # the trainer's lease on n1 alone runs out
            local = await acquire(n1.service, solo)  # once the trainer's lease is revoked
            with pytest.raises(AcquireTimeout, match="had not given its GPUs back"):
                await api_ops.acquire(n1.service, trainer, pb.AcquireRequest(timeout_ms=500))
            release(n2.service, sampler, theirs)  # the only member in the turn leaves
            await until(lambda: not arbiter.held and not n2.holders(), "the job's turn ends")
            release(n1.service, solo, local)

    run(body)


def test_a_members_leave_that_reaches_the_coordinator_after_its_next_join_is_ignored(
    tmp_path: Path,
) -> None:
    """The trainer yields and asks again at once; its Leave (sent in the background) reaches
    the coordinator only after its next Join was answered: the turn it computes in again does
    not end under it, and its next yield ends it."""

    async def body() -> None:
        async with cluster(tmp_path) as (n1, n2, arbiter):
            trainer = pod(n1, "rl-trainer")
            first = await acquire(n1.service, trainer)
            arrived, go, heard = asyncio.Queue[None](), asyncio.Event(), asyncio.Queue[bool]()
            leave = arbiter.leave

            async def late(*args: Any, **kwargs: Any) -> bool:
                arrived.put_nowait(None)
                await go.wait()  # held back until the trainer has joined again
                ended = await leave(*args, **kwargs)
                heard.put_nowait(ended)
                return ended

            arbiter.leave = late  # type: ignore[method-assign]
            release(n1.service, trainer, first)
            await asyncio.wait_for(arrived.get(), 5)
            again = await acquire(n1.service, trainer)  # its next Join is answered first
            go.set()
            assert not await asyncio.wait_for(heard.get(), 5)  # the late Leave ends nothing
            assert arbiter.held["team/rl"].joined == {"team/rl-trainer"}
            assert n1.holders() == {"GPU-n1": "team/rl-trainer"}
            assert n2.holders() == {"GPU-n2": "team/rl-sampler"}
            release(n1.service, trainer, again)  # its Leave of this join ends the turn
            assert await asyncio.wait_for(heard.get(), 5)
            await until(lambda: not n1.holders() and not n2.holders(), "the job's turn ends")

    run(body)


def test_a_members_leave_unheard_when_its_agent_restarts_is_sent_by_the_next_agent(
    tmp_path: Path,
) -> None:
    """The last member yields while no coordinator leads, and its agent restarts before a new
    leader is elected: the agent started again sends the Leave, so the job's turn ends."""

    async def body() -> None:
        async with cluster(tmp_path) as (n1, _n2, arbiter):
            await yield_unheard(n1, arbiter)
            gate = n1.service.jobs
            assert isinstance(gate, CoordinatedTurns)
            await gate.close()  # the agent stops with the Leave unheard
            await n1.restart({"team/rl-trainer": "rl", "team/sft-a": "sft"})
            table = arbiter.new_table()
            found = await recover(arbiter.view, arbiter.links, table, 2)
            arbiter.lead(2, table, found)  # a new leader, from the nodes' reports
            again = CoordinatedTurns(n1.turns, gate.address, TOKEN)
            n1.service.jobs = again
            again.start()  # sends the Leave the last agent could not
            try:
                await until(lambda: not arbiter.held, "the job's turn ends")
                granted = await acquire(n1.service, pod(n1, "sft-a"))
                assert granted.tenant_id == "team/sft-a"
            finally:
                await again.close()

    run(body)


def test_an_unjoin_the_coordinator_cannot_hear_does_not_hold_the_agents_stop(
    tmp_path: Path,
) -> None:
    """A Leave of a pod whose own acquire failed after it joined (no node turn keeps it) meets
    no leader as the agent stops: it is given up at once, not sent again and again."""

    async def body() -> None:
        async with cluster(tmp_path) as (n1, _n2, arbiter):
            leaves = heard_leaves(arbiter)
            arbiter.step_down("the Lease was lost")  # an election: nobody leads
            gate = n1.service.jobs
            assert isinstance(gate, CoordinatedTurns)
            request = pb_jt.LeaveRequest(namespace="team", job="rl", pod="team/rl-trainer")
            gate._send_leave(None, request)  # as `_unjoin` sends it
            await asyncio.wait_for(leaves.get(), 5)  # it meets no leader, and is to be retried
            await asyncio.wait_for(gate.close(), 5)  # the agent stops: not after 60 s of retries
            assert leaves.qsize() <= 1  # sent again once at most, as the stop came

    run(body)


def test_a_members_leave_after_a_join_whose_answer_was_lost_still_ends_the_turn(
    tmp_path: Path,
) -> None:
    """The trainer, in its job's turn, asks again; the coordinator hears the Join and notes a
    new join, but the answer never reaches the agent (the acquire's deadline): the agent no
    longer knows which join its Leave ends, so it names none, and the Leave is taken."""

    async def body() -> None:
        async with cluster(tmp_path) as (n1, n2, arbiter):
            trainer = pod(n1, "rl-trainer")
            mine = await acquire(n1.service, trainer)
            await arbiter.join("team", "rl", "", "team/rl-trainer", 5)  # heard: a new join
            gate = n1.service.jobs
            assert isinstance(gate, CoordinatedTurns)

            async def unanswered(*_: Any) -> Any:
                raise AcquireTimeout("no answer from the coordinator within the deadline")

            gate._join = unanswered  # type: ignore[method-assign,assignment]
            with pytest.raises(AcquireTimeout):
                await gate.join(trainer, "rl", 1)
            release(n1.service, trainer, mine)  # its Leave: the turn's last member leaves
            await until(lambda: not arbiter.held, "the job's turn ends")
            await until(lambda: not n1.holders() and not n2.holders(), "its GPUs are free")

    run(body)

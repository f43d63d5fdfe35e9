"""A job that asks for its turn on a group sharing GPUs with another group's turn it holds or
waits for, over llm-d's API on the coordinator with agents on loopback: node n1 is labelled
`group.timeslice.io/sample` too, so group "sample" covers the trainer pod on n1 and the sampler
pod on n2, and group "train" only the trainer pod."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import grpc
import pytest

from agent.core.errors import AlreadyHolding
from baton._pb import timeslice_orchestrator_pb2 as ts
from baton._pb import timeslice_orchestrator_pb2_grpc as ts_grpc
from coordinator.turns import Arbiter
from tests.coordinator.loopback import LoopbackNode
from tests.coordinator.test_llmd import run, serve, shut
from tests.coordinator.test_members import until


async def overlapping(
    tmp_path: Path,
) -> tuple[list[LoopbackNode], Arbiter, grpc.aio.Server, ts_grpc.TimeSliceOrchestratorServiceStub]:
    served = await serve(tmp_path, caller="team")
    view = served[1].view
    view.nodes["n1"] = dataclasses.replace(view.nodes["n1"], groups=frozenset({"sample"}))
    return served


async def acquire(stub: ts_grpc.TimeSliceOrchestratorServiceStub, group: str) -> None:
    answer = await stub.Acquire(ts.AcquireRequest(job_id="rl", group_id=group), timeout=5)
    assert answer.success is True


async def yield_(stub: ts_grpc.TimeSliceOrchestratorServiceStub, group: str) -> int:
    answer = await stub.Yield(ts.YieldRequest(job_id="rl", group_id=group), timeout=5)
    assert answer.snapshot_deferred == (not answer.pending_waiters)
    return int(answer.pending_waiters)


def test_a_group_that_shares_gpus_with_the_turn_held_but_needs_more_is_refused_naming_both(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        nodes, arbiter, server, stub = await overlapping(tmp_path)
        try:
            await acquire(stub, "train")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await acquire(stub, "sample")
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert refused.value.details() == (
                "job team/rl: its turn on group 'sample' shares n1/GPU-n1 with its turn on group "
                "'train', which it holds, and needs more (n2/GPU-n2): yield its turn on group "
                "'train' first"
            )
            assert not arbiter.table.waiters, "nothing was queued behind the job itself"
            assert (nodes[0].holders(), nodes[1].holders()) == ({"GPU-n1": "team/rl-trainer"}, {})
            assert await yield_(stub, "train") == 0
            await acquire(stub, "sample")  # as the message says
            assert nodes[1].holders() == {"GPU-n2": "team/rl-sampler"}
        finally:
            await shut(nodes, arbiter, server)

    run(body)


def test_a_group_the_held_turn_covers_is_granted_at_once_and_the_turn_ends_with_its_last_yield(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        nodes, arbiter, server, stub = await overlapping(tmp_path)
        try:
            await acquire(stub, "sample")
            turn = arbiter.held["team/rl@sample"]
            await acquire(stub, "train")  # the trainer pod computes in the sample turn already
            assert arbiter.held["team/rl@train"] is turn
            status = await stub.GetGroupStatus(
                ts.GetGroupStatusRequest(group_id="train"), timeout=5
            )
            assert (status.group.group_state, status.group.locking_job) == (
                ts.GroupStatus.STATE_LOCKED,
                "rl",
            )
            other = asyncio.ensure_future(arbiter.acquire("other", "eval", "train", timeout=10))
            await until(lambda: bool(arbiter.table.waiters), "job other/eval queued")
            assert await yield_(stub, "sample") == 1
            assert nodes[0].holders() == {"GPU-n1": "team/rl-trainer"}, "train still holds it"
            assert not other.done() and not turn.ended.is_set()
            assert await yield_(stub, "train") == 1
            assert turn.ended.is_set()
            await other
            assert nodes[0].holders() == {"GPU-n1": "other/eval-a"}
            assert nodes[1].holders() == {}
        finally:
            await shut(nodes, arbiter, server)

    run(body)


def test_a_group_sharing_gpus_with_the_turn_the_job_waits_for_is_refused_at_once(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        nodes, arbiter, server, stub = await overlapping(tmp_path)
        try:
            await arbiter.acquire("other", "eval", "train", timeout=5)
            waiting = asyncio.ensure_future(acquire(stub, "sample"))
            queued = arbiter.table.waiters.values
            await until(lambda: any(w.tenant_id == "team/rl@sample" for w in queued()), "queued")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await acquire(stub, "train")
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert refused.value.details() == (
                "job team/rl: its turn on group 'train' shares n1/GPU-n1 with its turn on group "
                "'sample', which it already waits for: ask again once that turn is held or "
                "given up"
            )
            await arbiter.yield_("other", "eval", "train")
            await waiting
            await acquire(stub, "train")  # asked again: the sample turn covers it
            assert (await yield_(stub, "train"), await yield_(stub, "sample")) == (0, 0)
            assert not any(node.holders() for node in nodes)
        finally:
            await shut(nodes, arbiter, server)

    run(body)


def test_a_member_pod_joins_no_group_turn_but_a_group_may_ride_on_its_jobs_turn(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        nodes, arbiter, server, stub = await overlapping(tmp_path)
        try:
            await acquire(stub, "sample")
            with pytest.raises(AlreadyHolding) as refused:
                await arbiter.join("team", "rl", "", "team/rl-trainer", timeout=5)
            assert str(refused.value) == (
                "job team/rl: its turn on all its members shares n1/GPU-n1, n2/GPU-n2 with its "
                "turn on group 'sample', which it holds: yield its turn on group 'sample' first"
            )
            assert await yield_(stub, "sample") == 0
            turn = await arbiter.join("team", "rl", "", "team/rl-trainer", timeout=5)
            await acquire(stub, "train")
            assert not await arbiter.leave("team", "rl", "", "team/rl-trainer"), "train holds it"
            assert nodes[0].holders() == {"GPU-n1": "team/rl-trainer"}
            assert await yield_(stub, "train") == 0
            assert turn.ended.is_set() and not any(node.holders() for node in nodes)
        finally:
            await shut(nodes, arbiter, server)

    run(body)

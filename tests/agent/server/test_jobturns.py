"""A job's turn on one node, as the coordinator drives it: prepare, commit, release, fencing."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from agent.core.fair import FairConfig, FairShare
from agent.core.leases import LeaseTable
from agent.core.residency import NullPreparer
from agent.node.jobturn_store import JobTurnStore
from agent.node.state import StateDirError, StateStore
from agent.node.tenants import POD, Tenant
from agent.server.jobturns import (
    COMMITTED,
    JobTurns,
    NodeTurn,
    NoMembers,
    PrepareFailed,
    StaleEpoch,
    UnknownTurn,
)
from agent.server.service import LeaseService
from baton.contract.names import LABEL_JOB, LABEL_LLMD_JOB

TOKEN = "s3cret-token"


def pod(name: str, gpus: tuple[str, ...], labels: dict[str, str] | None = None) -> Tenant:
    return Tenant(f"team/{name}", name, gpus, source=POD, labels=labels or {})


def node(tmp_path: Path) -> tuple[LeaseService, JobTurns]:
    service = LeaseService(
        table=LeaseTable(clock=time.time),
        preparer=lambda host: NullPreparer(),
        clock=time.time,
        store=StateStore(tmp_path),
    )
    service.load()
    for tenant in (
        pod("trainer", ("GPU-0",), {LABEL_JOB: "rl"}),
        pod("sampler", ("GPU-1",), {LABEL_LLMD_JOB: "rl"}),  # llm-d's label names the same job
        pod("other", ("GPU-0", "GPU-1")),
    ):
        service.upsert_pod(tenant)
    turns = JobTurns(service, "n1", JobTurnStore(tmp_path), time.time)
    turns.load()
    return service, turns


def revoking_node(tmp_path: Path) -> tuple[LeaseService, JobTurns]:
    """A node of a job's trainer and a node-local pod on GPU-0 whose maximum hold (0.2 s, until
    a test raises it) revokes the trainer's turn once the local pod asks."""
    service = LeaseService(
        table=LeaseTable(clock=time.time, max_hold=0.2),
        preparer=lambda host: NullPreparer(),
        clock=time.time,
        store=StateStore(tmp_path),
    )
    service.load()
    service.upsert_pod(pod("trainer", ("GPU-0",), {LABEL_JOB: "rl"}))
    service.upsert_pod(pod("solo", ("GPU-0",)))
    turns = JobTurns(service, "n1", JobTurnStore(tmp_path), time.time)
    turns.load()
    return service, turns


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 10))


def test_a_prepared_turn_holds_every_member_and_its_release_serves_the_next(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        service, turns = node(tmp_path)
        turn = await turns.prepare(1, "t1", "team", "rl", timeout=5)
        assert turn.members == ("team/sampler", "team/trainer")
        assert turn.gpus == ("GPU-0", "GPU-1")
        assert {lease.tenant_id for lease in service.table.leases.values()} == set(turn.members)
        assert await turns.prepare(1, "t1", "team", "rl", timeout=5) is turn  # idempotent
        assert turns.commit(1, "t1").state == COMMITTED
        other = service.tenants.tenants["team/other"]
        waiting = asyncio.create_task(service.acquire(other, (), timeout=5))
        await asyncio.sleep(0)
        assert not waiting.done()  # the job holds both GPUs
        assert turns.release(1, "t1", "yielded")
        granted = await waiting
        assert granted.lease.tenant_id == "team/other"
        assert not turns.release(1, "t1", "again")  # gone already: nothing to release
        await service.close()

    run(body)


def test_an_older_epoch_is_refused_also_after_a_restart(tmp_path: Path) -> None:
    async def body() -> None:
        service, turns = node(tmp_path)
        await turns.prepare(3, "t1", "team", "rl", timeout=5)
        with pytest.raises(StaleEpoch, match="epoch 2 is older than epoch 3"):
            turns.commit(2, "t1")
        turns.commit(3, "t1")
        await service.close()
        again = JobTurns(service, "n1", JobTurnStore(tmp_path), time.time)
        again.load()
        assert again.epoch == 3
        assert again.turns["t1"].state == COMMITTED  # taken up: its leases live on
        assert service.sessions.connected("team/trainer")
        with pytest.raises(StaleEpoch):
            again.release(1, "t1", "deposed leader")
        assert again.release(4, "t1", "new leader")

    run(body)


def test_a_fence_that_cannot_be_read_after_a_restart_is_refused_not_forgotten(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        service, turns = node(tmp_path)
        await turns.prepare(3, "t1", "team", "rl", timeout=5, holder="coordinator-a")
        await service.close()
        (tmp_path / "coordination-epoch").write_text("3\x00garbage")  # a damaged disk
        again = JobTurns(service, "n1", JobTurnStore(tmp_path), time.time)
        with pytest.raises(StateDirError, match=r"coordination-epoch: holds .*, not an epoch"):
            again.load()  # not epoch 0, where a deposed leader's epoch 2 would be obeyed
        (tmp_path / "coordination-epoch").write_text("3\n")
        (tmp_path / "coordination-holder").unlink()
        (tmp_path / "coordination-holder").mkdir()  # unreadable (EISDIR)
        with pytest.raises(StateDirError, match=r"coordination-holder: cannot be read"):
            JobTurns(service, "n1", JobTurnStore(tmp_path), time.time).load()

    run(body)


def test_an_epoch_is_obeyed_from_one_leader_only_also_after_a_restart(tmp_path: Path) -> None:
    """A Lease created again counts from 1 again: two leaders may lead in one epoch."""

    async def body() -> None:
        service, turns = node(tmp_path)
        await turns.prepare(1, "t1", "team", "rl", timeout=5, holder="coordinator-a")
        with pytest.raises(StaleEpoch, match="epoch 1 is led by coordinator-a here, not by "):
            turns.commit(1, "t1", "coordinator-b")
        assert [t.turn_id for t in turns.report(1, "coordinator-b")] == ["t1"]  # only reads
        assert (turns.epoch, turns.holder) == (1, "coordinator-a")
        assert turns.commit(1, "t1", "coordinator-a").state == COMMITTED
        turns.commit(1, "t1")  # a coordinator that names none (an older one): not checked
        await service.close()
        again = JobTurns(service, "n1", JobTurnStore(tmp_path), time.time)
        again.load()
        assert (again.epoch, again.holder) == (1, "coordinator-a")
        with pytest.raises(StaleEpoch, match="not by coordinator-b"):
            again.release(1, "t1", "the other leader", "coordinator-b")
        assert again.release(2, "t1", "a higher epoch", "coordinator-b")
        assert (again.epoch, again.holder) == (2, "coordinator-b")

    run(body)


def test_a_turn_whose_member_the_maximum_hold_revoked_for_another_jobs_turn_ends_here(
    tmp_path: Path,
) -> None:
    """The coordinator released turn t1 (not heard: the agent was restarting) and prepared
    job sft's t2 on its GPU; t2 waited behind t1's member until the maximum hold revoked it.
    t1 is over here then: the report names one turn on the GPU, and t1's member is not queued
    to take the GPU back from t2."""

    async def body() -> None:
        service = LeaseService(
            table=LeaseTable(clock=time.time, max_hold=0.1),
            preparer=lambda host: NullPreparer(),
            clock=time.time,
            store=StateStore(tmp_path),
        )
        service.load()
        service.upsert_pod(pod("trainer", ("GPU-0",), {LABEL_JOB: "rl"}))
        service.upsert_pod(pod("tuner", ("GPU-0",), {LABEL_JOB: "sft"}))
        turns = JobTurns(service, "n1", JobTurnStore(tmp_path), time.time)
        turns.load()
        await turns.prepare(1, "t1", "team", "rl", timeout=5)
        turns.commit(1, "t1")
        await turns.prepare(1, "t2", "team", "sft", timeout=5)  # in once t1's is revoked
        assert [(t.turn_id, t.gpus) for t in turns.report(1)] == [("t2", ("GPU-0",))]
        assert [lease.tenant_id for lease in service.table.leases.values()] == ["team/tuner"]
        assert not service.table.waiters  # the trainer's resume went with its turn
        assert not service.sessions.connected("team/trainer")
        assert not turns.release(1, "t1", "yielded")  # heard at last: nothing left of it
        again = JobTurns(service, "n1", JobTurnStore(tmp_path), time.time)
        again.load()
        assert list(again.turns) == ["t2"]  # and so on disk
        await service.close()

    run(body)


def test_a_turn_names_the_lease_that_gives_a_revoked_member_its_gpu_back_also_on_disk(
    tmp_path: Path,
) -> None:
    """The maximum hold revokes the trainer's turn for a node-local pod and gives it back under
    a new lease: the job's turn names that lease, and an agent started again takes it up."""

    async def body() -> None:
        service, turns = revoking_node(tmp_path)
        first = (await turns.prepare(1, "t1", "team", "rl", timeout=5)).leases[0]
        service.table.max_hold = 60.0  # the trainer's turn alone runs out
        solo = service.tenants.tenants["team/solo"]
        local = await service.acquire(solo, (), timeout=5)  # once the trainer's is revoked
        service.yield_(solo, local.lease.lease_id)  # the trainer's turn is given back
        [resumed] = service.table.leases_of("team/trainer")
        assert turns.turns["t1"].leases == (resumed.lease_id,)
        assert turns.turn_of_lease("team/trainer", first) is turns.turns["t1"]
        await service.close()
        service, again = revoking_node(tmp_path)  # the agent restarts
        assert list(again.turns) == ["t1"]
        assert again.lease_of("team/trainer", "t1") == (again.turns["t1"], resumed.lease_id)
        assert again.release(1, "t1", "yielded")
        assert not service.table.leases
        await service.close()

    run(body)


def test_a_job_with_no_pod_here_and_an_unknown_turn_are_named(tmp_path: Path) -> None:
    async def body() -> None:
        service, turns = node(tmp_path)
        with pytest.raises(NoMembers, match="job team/nope has no pod with GPUs on node n1"):
            await turns.prepare(1, "t1", "team", "nope", timeout=5)
        with pytest.raises(NoMembers, match="team/other: no pod of job team/rl"):
            await turns.prepare(1, "t1", "team", "rl", 5, pods=["team/trainer", "team/other"])
        only = await turns.prepare(1, "t2", "team", "rl", timeout=5, pods=["team/trainer"])
        assert only.members == ("team/trainer",)
        with pytest.raises(UnknownTurn, match="no prepared turn 't9'"):
            turns.commit(1, "t9")
        await service.close()

    run(body)


def test_a_release_during_the_preparation_takes_its_members_out_of_the_queue(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        service, turns = node(tmp_path)
        other = service.tenants.tenants["team/other"]
        held = await service.acquire(other, (), timeout=5)
        preparing = asyncio.create_task(turns.prepare(1, "t1", "team", "rl", timeout=5))
        while not service.table.waiters:  # both members queue behind `other`
            await asyncio.sleep(0)
        assert turns.release(1, "t1", "rolled back: node n2 failed")
        with pytest.raises(asyncio.CancelledError):
            await preparing
        assert not service.table.waiters
        assert not service.sessions.connected("team/trainer")
        service.yield_(other, held.lease.lease_id)
        assert not service.table.leases  # nothing was granted to the rolled-back job
        await service.close()

    run(body)


def test_a_member_that_cannot_get_its_turn_fails_the_prepare_naming_it(tmp_path: Path) -> None:
    async def body() -> None:
        service, turns = node(tmp_path)
        other = service.tenants.tenants["team/other"]
        await service.acquire(other, ("GPU-1",), timeout=5)  # the sampler's GPU stays taken
        with pytest.raises(PrepareFailed, match="pod team/sampler on node n1"):
            await turns.prepare(1, "t1", "team", "rl", timeout=0.2)
        assert [lease.tenant_id for lease in service.table.leases.values()] == ["team/other"]
        await service.close()

    run(body)


def test_a_preparation_cancelled_half_way_gives_back_what_it_was_granted(tmp_path: Path) -> None:
    async def body() -> None:
        service, turns = node(tmp_path)
        other = service.tenants.tenants["team/other"]
        await service.acquire(other, ("GPU-1",), timeout=5)  # the sampler must wait
        preparing = asyncio.create_task(turns.prepare(1, "t1", "team", "rl", timeout=5))
        while "team/trainer" not in {lease.tenant_id for lease in service.table.leases.values()}:
            await asyncio.sleep(0)  # the trainer's turn is granted, the sampler's waits
        preparing.cancel()  # the coordinator's call went away
        with pytest.raises(asyncio.CancelledError):
            await preparing
        assert [lease.tenant_id for lease in service.table.leases.values()] == ["team/other"]
        assert not service.table.waiters
        assert not service.sessions.connected("team/trainer")
        await service.close()

    run(body)


def test_two_members_on_one_gpu_are_refused_at_once_naming_both(tmp_path: Path) -> None:
    async def body() -> None:
        service, turns = node(tmp_path)
        service.upsert_pod(pod("eval", ("GPU-0",), {LABEL_JOB: "rl"}))
        with pytest.raises(PrepareFailed, match="pods team/eval and team/trainer of job team/rl"):
            await turns.prepare(1, "t1", "team", "rl", timeout=5)
        assert not service.table.leases and not service.table.waiters
        await service.close()

    run(body)


def test_a_turn_is_saved_without_its_sessions_and_read_back_whole():
    class Unsaved:
        """A session: never copied nor written."""

        def __deepcopy__(self, memo):
            raise AssertionError("a session was copied to save a turn")

    turn = NodeTurn(
        turn_id="t1", namespace="team", job="j", epoch=3, members=("team/a",), leases=("l1",),
        gpus=("GPU-0",), tokens=(7,), prepared_at=1.5, nodes=("n1", "n2"), joined=["team/a"],
        sessions=[Unsaved()],  # type: ignore[list-item]
    )  # fmt: skip
    saved = json.loads(json.dumps(turn.to_json()))
    assert "sessions" not in saved
    assert NodeTurn.from_json(saved) == turn  # sessions do not compare


def test_the_fair_policy_keeps_no_gpu_for_a_member_whose_job_turn_ends(tmp_path: Path) -> None:
    """Under the fair policy a yielder that is owed and usually comes straight back has its GPU
    kept for it (anticipation). A job's member does not choose its next turn: the coordinator
    does, after the other job's. So the member's release serves the waiter at once, however
    little GPU time the member has had and however soon its job asked again before."""
    fair = FairShare(FairConfig(anticipate_s=2.0))  # a hold would outlast the wait's bound

    async def body() -> None:
        service = LeaseService(
            table=LeaseTable(clock=time.time, policy=fair),
            preparer=lambda host: NullPreparer(),
            clock=time.time,
            store=StateStore(tmp_path),
        )
        service.load()
        trainer = pod("trainer", ("GPU-0",), {LABEL_JOB: "rl"})
        other = Tenant("team/other", "other", ("GPU-0",), source=POD, gpu_duty=1)  # slow clock
        for tenant in (trainer, other):
            service.upsert_pod(tenant)
        turns = JobTurns(service, "n1", JobTurnStore(tmp_path), time.time)
        turns.load()
        for i in range(3):  # the job comes back at once, twice: a return time is learnt
            await turns.prepare(1, f"t{i}", "team", "rl", timeout=5)
            turns.release(1, f"t{i}", "yielded")
        granted = await service.acquire(other, (), timeout=5)  # then other runs: the job is owed
        await asyncio.sleep(0.05)  # at 1% duty: 5 s of its time, past the 2 s window
        service.yield_(other, granted.lease.lease_id)
        await turns.prepare(1, "t3", "team", "rl", timeout=5)
        waiting = asyncio.create_task(service.acquire(other, (), timeout=5))
        await asyncio.sleep(0)
        assert not waiting.done()
        turns.release(1, "t3", "yielded")  # owed, and back within the window: yet not kept
        lease = (await asyncio.wait_for(waiting, 1)).lease
        assert lease.tenant_id == "team/other"
        assert not service.table.anticipation.holds
        await service.close()

    run(body)


def test_a_member_whose_revoked_turn_waits_to_be_given_back_keeps_its_jobs_turn_on_restart(
    tmp_path: Path,
) -> None:
    """The agent restarts while the trainer's revoked turn waits for the node-local pod's to
    end: the job's turn is taken up, and the lease it names is the one the trainer gets."""

    async def body() -> None:
        service, turns = revoking_node(tmp_path)
        await turns.prepare(1, "t1", "team", "rl", timeout=5)
        service.table.max_hold = 60.0  # the trainer's turn alone runs out
        solo = service.tenants.tenants["team/solo"]
        local = await service.acquire(solo, (), timeout=5)  # once the trainer's is revoked
        [resume] = turns.turns["t1"].leases
        await service.close()
        # The agent restarts with the trainer's turn to give back.
        service, again = revoking_node(tmp_path)
        assert list(again.turns) == ["t1"]
        assert [w.waiter_id for w in service.table.waiters.values() if w.front] == [resume]
        service.yield_(service.tenants.tenants["team/solo"], local.lease.lease_id)
        assert [x.lease_id for x in service.table.leases_of("team/trainer")] == [resume]
        assert again.lease_of("team/trainer", "t1") == (again.turns["t1"], resume)
        assert again.release(1, "t1", "yielded")
        assert not service.table.leases and not service.table.waiters
        await service.close()

    run(body)

"""A job turn is made as its last member is granted (`agent.server.jobturn_prepare`)."""

from __future__ import annotations

import asyncio
from asyncio import Task
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.node.jobturn_store import JobTurnStore
from agent.server import jobturns_link
from agent.server.jobturns import JobTurns, NodeTurn, PrepareFailed
from agent.server.service import LeaseService
from agent.server.turn_state import Granted
from baton._pb import jobturns_pb2 as jt
from baton.contract import framing
from tests.agent.server.test_jobturns import node, pod, run
from tests.agent.server.test_jobturns_link import holders, until


async def queued_behind(
    service: LeaseService, turns: JobTurns, tell: Callable[[NodeTurn], None] | None = None
) -> tuple[Granted, Task, list]:
    """`team/other` holds both GPUs; the job's turn t1 is being prepared, both of its members
    queued behind it. Returns other's grant, the preparation and the turns it tells of (to
    `tell` instead, if given)."""
    other = service.tenants.tenants["team/other"]
    held = await service.acquire(other, (), timeout=5)
    told: list[NodeTurn] = []
    preparing = asyncio.create_task(
        turns.prepare(1, "t1", "team", "rl", timeout=5, on_prepared=tell or told.append)
    )
    while len(service.table.waiters) < 2:
        await asyncio.sleep(0)
    return held, preparing, told


def test_the_turn_is_made_and_told_in_the_step_of_the_last_members_grant(tmp_path: Path) -> None:
    async def body() -> None:
        service, turns = node(tmp_path)
        other = service.tenants.tenants["team/other"]
        held, preparing, told = await queued_behind(service, turns)
        service.yield_(other, held.lease.lease_id)  # grants both members, in this step
        assert [t.turn_id for t in told] == ["t1"]  # no await since: made and told at once
        assert turns.turns["t1"] is told[0]
        assert turns.report(1) == [told[0]]
        assert await preparing is told[0]
        assert {lease.tenant_id for lease in service.table.leases.values()} == {
            "team/sampler",
            "team/trainer",
        }
        await service.close()

    run(body)


def test_a_turn_released_as_soon_as_it_is_made_ends_once(tmp_path: Path) -> None:
    async def body() -> None:
        service, turns = node(tmp_path)
        other = service.tenants.tenants["team/other"]
        held, preparing, told = await queued_behind(service, turns)
        service.yield_(other, held.lease.lease_id)
        assert told  # made; its preparation's task has not ended yet
        assert turns.release(1, "t1", "yielded")  # the coordinator's release, in that window
        with pytest.raises(asyncio.CancelledError):
            await preparing
        assert not service.table.leases  # the members' turns ended with the turn
        assert not service.table.waiters
        assert not turns.turns
        assert not service.sessions.connected("team/trainer")
        await service.close()

    run(body)


def test_a_preparation_released_before_its_last_grant_is_not_made(tmp_path: Path) -> None:
    async def body() -> None:
        service, turns = node(tmp_path)
        other = service.tenants.tenants["team/other"]
        held, preparing, told = await queued_behind(service, turns)
        assert turns.release(1, "t1", "rolled back: node n2 failed")  # its members still queue
        service.yield_(other, held.lease.lease_id)  # and are granted before the cancel lands
        with pytest.raises(asyncio.CancelledError):
            await preparing
        assert not told
        assert not turns.turns
        assert not service.table.leases  # what the members were granted went back
        await service.close()

    run(body)


def test_a_turn_that_cannot_be_recorded_fails_its_prepare_and_gives_its_turns_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body() -> None:
        service, turns = node(tmp_path)

        def full(_: object) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(turns._store, "save_turns", full)
        told: list[NodeTurn] = []
        with pytest.raises(PrepareFailed, match=r"node n1 could not record the turn: .*No space"):
            await turns.prepare(1, "t1", "team", "rl", timeout=5, on_prepared=told.append)
        assert not told
        assert not turns.turns
        assert not service.table.leases
        assert not service.sessions.connected("team/sampler")
        await service.close()

    run(body)


def test_a_member_revoked_before_the_last_grant_is_in_the_turn_under_the_lease_giving_it_back(
    tmp_path: Path,
) -> None:
    """The trainer, granted first, holds past the maximum hold while the sampler still waits
    and a node-local pod waits for its GPU: it is parked, and the job's turn names the turn
    that gives it its GPU back, as for a member revoked once the turn is made."""

    async def body() -> None:
        service, turns = node(tmp_path)
        service.upsert_pod(pod("solo", ("GPU-0",)))
        other = service.tenants.tenants["team/other"]
        held = await service.acquire(other, ("GPU-1",), timeout=5)  # the sampler waits
        service.table.max_hold = 0.1  # the trainer's turn runs out
        preparing = asyncio.create_task(turns.prepare(1, "t1", "team", "rl", timeout=5))
        await until(lambda: bool(service.table.leases_of("team/trainer")))
        [first] = service.table.leases_of("team/trainer")
        service.table.max_hold = 60.0
        solo = service.tenants.tenants["team/solo"]
        local = await service.acquire(solo, (), timeout=5)  # once the trainer's is revoked
        service.yield_(other, held.lease.lease_id)  # the sampler's grant makes the turn
        turn = await preparing
        [resume] = [w.waiter_id for w in service.table.waiters.values() if w.front]
        assert turn.lease_of("team/trainer") == resume  # no lease the node holds: its resume
        assert turns.turn_of_lease("team/trainer", first.lease_id) is turn
        service.yield_(solo, local.lease.lease_id)  # the trainer's turn is given back
        assert turns.lease_of("team/trainer", "t1") == (turn, resume)
        assert [t["leases"] for t in JobTurnStore(tmp_path).load_turns()] == [list(turn.leases)]
        assert turns.release(1, "t1", "yielded")
        assert not service.table.leases and not service.table.waiters
        await service.close()

    run(body)


# The coordinator's link answers in the grant's step; the call's task ends steps later.

MEMBERS = {"team/sampler", "team/trainer"}


class Answers:
    """The coordinator's end of a link: the answers written to it, in order."""

    def __init__(self) -> None:
        self.got: list[jt.JobTurnsAnswer] = []

    def write(self, data: bytes) -> None:
        while data:
            (size,) = framing.HEADER.unpack_from(data)
            body = data[framing.HEADER.size : framing.HEADER.size + size]
            data = data[framing.HEADER.size + size :]
            self.got.append(framing.decode(jt.JobTurnsAnswer, body))

    def is_closing(self) -> bool:
        return False

    def kinds(self) -> list[tuple[int, str | None]]:
        return [(answer.id, answer.WhichOneof("answer")) for answer in self.got]


async def linked(
    service: LeaseService, turns: JobTurns
) -> tuple[Granted, Answers, jobturns_link._Connection]:
    """As `queued_behind`, t1 asked for by the coordinator's call 1 on a link."""
    other = service.tenants.tenants["team/other"]
    held = await service.acquire(other, (), timeout=5)
    out = Answers()
    link = jobturns_link._Connection(turns, out)  # type: ignore[arg-type]
    prepare = jt.PrepareRequest(epoch=1, turn_id="t1", namespace="team", job="rl")
    link.handle(jt.JobTurnsCall(id=1, prepare=prepare))
    await until(lambda: len(service.table.waiters) == 2)
    return held, out, link


@pytest.mark.parametrize("ending", ["cancel", "disconnect"])
def test_a_turn_answered_at_its_last_grant_stands_when_its_call_ends_before_its_task(
    tmp_path: Path, ending: str
) -> None:
    """The coordinator heard "prepared": its cancel crossing that answer, or the connection's
    end, leaves the turn held and recorded (the coordinator's roll-back releases it), rather
    than giving back the members' turns of a turn the node reports."""

    async def body() -> None:
        service, turns = node(tmp_path)
        try:
            held, out, link = await linked(service, turns)
            service.yield_(service.tenants.tenants["team/other"], held.lease.lease_id)
            assert out.kinds() == [(1, "turn")]  # in the grant's step
            if ending == "cancel":
                link.handle(jt.JobTurnsCall(id=1, cancel=jt.Cancel()))
            else:
                await link.close()
            await until(lambda: turns.preparation("t1") is None and not link.running)
            assert out.kinds() == [(1, "turn")]
            assert [t.turn_id for t in turns.report(1)] == ["t1"]
            assert holders(service) == MEMBERS
            assert service.sessions.connected("team/trainer")  # its stand-in session stays
            await link.close()
        finally:
            await service.close()

    run(body)


def test_a_turn_released_as_soon_as_it_is_answered_is_answered_once(tmp_path: Path) -> None:
    """Prepared, then released before the preparation's task ended: the prepare's answer is
    the turn, and the release's says it ended; no refusal follows the turn."""

    async def body() -> None:
        service, turns = node(tmp_path)
        try:
            held, out, link = await linked(service, turns)
            service.yield_(service.tenants.tenants["team/other"], held.lease.lease_id)
            release = jt.ReleaseRequest(epoch=1, turn_id="t1", reason="rolled back")
            link.handle(jt.JobTurnsCall(id=2, release=release))
            await until(lambda: turns.preparation("t1") is None and not link.running)
            assert out.kinds() == [(1, "turn"), (2, "released")]
            assert out.got[1].released.released
            assert not holders(service) and not service.table.waiters and not turns.turns
            await link.close()
        finally:
            await service.close()

    run(body)


def test_a_turn_its_last_grant_could_not_record_is_recorded_and_answered_once_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turns file refuses the write in the last grant's step and takes it as the
    members' acquires end: the coordinator hears of the turn once, then."""

    async def body() -> None:
        service, turns = node(tmp_path)
        save = turns._store.save_turns
        refusals = [OSError(28, "No space left on device")]

        def once_full(data: list[dict[str, object]]) -> None:
            if refusals:
                raise refusals.pop()
            save(data)

        monkeypatch.setattr(turns._store, "save_turns", once_full)
        try:
            held, out, link = await linked(service, turns)
            service.yield_(service.tenants.tenants["team/other"], held.lease.lease_id)
            assert not refusals and not out.got and not turns.turns  # not recorded, not told
            await until(lambda: turns.preparation("t1") is None and not link.running)
            assert out.kinds() == [(1, "turn")]
            assert list(turns.turns) == ["t1"] and holders(service) == MEMBERS
            on_disk = JobTurnStore(tmp_path)
            assert [t["turn_id"] for t in on_disk.load_turns()] == ["t1"]
            on_disk.close()
            await link.close()
        finally:
            await service.close()

    run(body)


def test_a_listener_that_fails_does_not_fail_the_grant_that_made_the_turn(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        service, turns = node(tmp_path)
        other = service.tenants.tenants["team/other"]

        def broken(turn: NodeTurn) -> None:
            raise RuntimeError("the listener's own defect")

        held, preparing, _ = await queued_behind(service, turns, broken)
        service.yield_(other, held.lease.lease_id)  # the other's yield is not the one to fail
        turn = await preparing
        assert turns.turns["t1"] is turn
        assert {lease.tenant_id for lease in service.table.leases.values()} == set(turn.members)
        await service.close()

    run(body)
    assert "job turn t1: telling of it failed" in caplog.messages


def test_a_member_granted_as_the_stopping_agent_gives_the_preparation_up_is_given_back(
    tmp_path: Path,
) -> None:
    """The agent stops (its job-turn connections cancel their preparations) in the step that
    grants one member: no turn was made or answered, so nobody outside knows of that grant, and
    the member's turn goes back rather than staying held for the next agent's grace."""

    async def body() -> None:
        service, turns = node(tmp_path)
        other = service.tenants.tenants["team/other"]
        on_0 = await service.acquire(other, ("GPU-0",), timeout=5)
        await service.acquire(other, ("GPU-1",), timeout=5)
        preparing = asyncio.create_task(turns.prepare(1, "t1", "team", "rl", timeout=5))
        await until(lambda: len(service.table.waiters) == 2)
        service.stopping = True  # the agent stops: its connection's end cancels the preparation
        turns._preparing["t1"].task.cancel()
        service.yield_(other, on_0.lease.lease_id)  # and in this step the trainer is granted
        assert "team/trainer" in holders(service)
        with pytest.raises(asyncio.CancelledError):
            await preparing
        assert holders(service) == {"team/other"}
        assert not service.table.waiters and not turns.turns
        await service.close()

    run(body)

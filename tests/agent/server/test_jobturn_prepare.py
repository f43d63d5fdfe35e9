"""A job turn is made as its last member is granted (`agent.server.jobturn_prepare`)."""

from __future__ import annotations

import asyncio
from asyncio import Task
from pathlib import Path

import pytest

from agent.server.jobturns import JobTurns, NodeTurn, PrepareFailed
from agent.server.service import LeaseService
from agent.server.turn_state import Granted
from tests.agent.server.test_jobturns import node, run


async def queued_behind(service: LeaseService, turns: JobTurns) -> tuple[Granted, Task, list]:
    """`team/other` holds both GPUs; the job's turn t1 is being prepared, both of its members
    queued behind it. Returns other's grant, the preparation and the turns it tells of."""
    other = service.tenants.tenants["team/other"]
    held = await service.acquire(other, (), timeout=5)
    told: list[NodeTurn] = []
    preparing = asyncio.create_task(
        turns.prepare(1, "t1", "team", "rl", timeout=5, on_prepared=told.append)
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

"""A member pod whose acquire finds its job's turn held but its own GPU not given back yet (the
node revoked its lease there): the acquire joins the turn as the node gives the GPU back, woken
by that grant, not at its next look."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent.core.leases import Lease
from agent.node.tenants import Tenant
from agent.server import coordinated
from agent.server.coordinated import CoordinatedTurns
from baton._pb import jobturns_pb2 as jt
from tests.coordinator.test_members import acquire, cluster, pod, release, run, until


def test_a_member_waiting_for_its_revoked_gpu_joins_as_the_node_gives_it_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(coordinated, "RETRY_FIRST_S", 30.0)  # a look after the first: too late
    monkeypatch.setattr(coordinated, "RETRY_MAX_S", 30.0)
    looks: list[Lease | None] = []
    lease_in = CoordinatedTurns._lease_in

    def look(self: CoordinatedTurns, tenant: Tenant, answer: jt.JoinResponse) -> Lease | None:
        looks.append(found := lease_in(self, tenant, answer))
        return found

    monkeypatch.setattr(CoordinatedTurns, "_lease_in", look)

    async def body() -> None:
        async with cluster(tmp_path) as (n1, _n2, _arbiter):
            trainer = pod(n1, "rl-trainer")
            solo = n1.add_pod("team/solo", ("GPU-n1",))  # no job: a node-local tenant
            n1.service.table.max_hold = 0.2
            await acquire(n1.service, trainer)
            n1.service.table.max_hold = 60.0  # the trainer's turn alone runs out
            local = await acquire(n1.service, solo)  # once the trainer's turn is revoked
            looks.clear()
            theirs = asyncio.create_task(acquire(n1.service, trainer))  # a 10 s deadline
            await until(lambda: looks == [None], "the trainer finds its GPU not given back")
            release(n1.service, solo, local)  # the node gives the trainer its GPU back
            lease = await asyncio.wait_for(theirs, 5)
            [held] = n1.service.table.leases_of(trainer.tenant_id)
            assert lease.lease_id == held.lease_id
            assert len(looks) == 2  # woken by the grant: one look more, at once

    run(body)

"""A job's member and a node-local pod of a higher tier (`--queue-policy fair --tier-grace S`):
the node does not revoke the member for the tier, since its job's other members would go on
holding their GPUs on their own nodes, idle (a half-job). The node-local pod waits for the
job's turn to end; the job gets its next turn after it."""

from __future__ import annotations

import asyncio
import time
from functools import partial
from pathlib import Path

import pytest

from agent.core.errors import AcquireTimeout
from agent.core.fair import FairConfig, FairShare
from agent.core.leases import LeaseTable
from agent.server import api_ops
from baton._pb import agent_pb2 as pb
from tests.coordinator import loopback
from tests.coordinator.test_members import acquire, cluster, pod, release, run, until

GRACE_S = 0.1


def test_a_member_is_not_revoked_for_a_higher_tier_so_its_job_never_holds_half_its_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fair = partial(LeaseTable, policy=FairShare(FairConfig(tier_grace_s=GRACE_S)))
    monkeypatch.setattr(loopback, "LeaseTable", fair)  # the agents' tables, not the arbiter's

    async def body() -> None:
        async with cluster(tmp_path) as (n1, n2, arbiter):
            trainer = pod(n1, "rl-trainer")
            urgent = n1.add_pod("team/urgent", ("GPU-n1",))  # no job: a node-local tenant
            urgent.priority = 1  # above the job's members (tier 0)
            mine = await acquire(n1.service, trainer)  # the job's turn, on n1 and n2
            asked = time.monotonic()
            with pytest.raises(AcquireTimeout):  # five graces: the trainer is not revoked
                await api_ops.acquire(
                    n1.service, urgent, pb.AcquireRequest(timeout_ms=int(5000 * GRACE_S))
                )
            assert time.monotonic() - asked >= 5 * GRACE_S
            assert n1.holders() == {"GPU-n1": "team/rl-trainer"}  # the whole job computes
            assert n2.holders() == {"GPU-n2": "team/rl-sampler"}
            theirs = asyncio.create_task(acquire(n1.service, urgent))
            await until(lambda: len(n1.service.table.waiters) == 1, "the urgent pod waits")
            [lease] = n1.service.table.leases_of(trainer.tenant_id)
            assert n1.service.table.revoke_at(lease) == lease.hold_until  # the maximum hold only
            release(n1.service, trainer, mine)  # the job yields: its turn ends on both nodes
            local = await asyncio.wait_for(theirs, 5)
            assert n1.holders() == {"GPU-n1": "team/urgent"}
            await until(lambda: not n2.holders() and not arbiter.held, "the job's turn ends")
            again = asyncio.create_task(acquire(n1.service, trainer))  # the job's next turn
            await until(lambda: bool(n2.holders()), "the job's next turn is being prepared")
            assert n1.holders() == {"GPU-n1": "team/urgent"}  # n1 serves the higher tier first
            release(n1.service, urgent, local)
            await asyncio.wait_for(again, 5)
            assert n1.holders() == {"GPU-n1": "team/rl-trainer"}
            assert n2.holders() == {"GPU-n2": "team/rl-sampler"}

    run(body)

"""The fair policy's clocks survive a change of leader: dumped by one table, taken up by the
next, so the job that had the GPUs is not served first again."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import pytest

from agent.core.fair import FairShare
from agent.core.leases import LeaseTable
from coordinator import fairstate
from coordinator.agents import AgentLinks
from coordinator.recovery import recover
from coordinator.turns import Arbiter
from tests.coordinator.loopback import TOKEN, leading
from tests.coordinator.test_turns import close, cluster, run


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_next_leader_serves_the_job_that_had_less_first() -> None:
    clock = Clock()
    old = LeaseTable(clock=clock, policy=FairShare())
    gpus = ("n1/GPU-0", "n2/GPU-0")
    waiting = {job: old.enqueue(job, gpus) for job in ("team/heavy", "team/light")}
    for job, held in (("team/heavy", 10.0), ("team/light", 1.0)):  # both asked from the start
        (picked,) = old.pick()
        assert picked.waiter_id == waiting[job].waiter_id
        lease = old.grant(picked.waiter_id)
        clock.now += held
        old.release(lease.lease_id)
    text = fairstate.dump(old)
    new = LeaseTable(clock=clock, policy=FairShare())
    assert fairstate.load(new, text)
    heavy = new.enqueue("team/heavy", gpus)
    light = new.enqueue("team/light", gpus)
    assert [w.waiter_id for w in new.queue()] == [light.waiter_id, heavy.waiter_id]
    fresh = LeaseTable(clock=clock, policy=FairShare())  # without the clocks: arrival order
    first = fresh.enqueue("team/heavy", gpus)
    assert fresh.queue()[0].waiter_id == first.waiter_id


def test_unreadable_clocks_and_another_policy_start_afresh() -> None:
    fair = LeaseTable(clock=Clock(), policy=FairShare())
    assert not fairstate.load(fair, '{"vtime": 3}')
    assert not fairstate.load(fair, "")
    fifo = LeaseTable(clock=Clock())
    assert fairstate.dump(fifo) == ""
    assert not fairstate.load(fifo, fairstate.dump(fair))


def test_the_clocks_carried_stay_bounded_forgetting_the_idle_jobs_furthest_behind() -> None:
    clock = Clock()
    table = LeaseTable(clock=clock, policy=FairShare())
    assert table.fair is not None
    gpus = ("n1/GPU-0",)
    table.fair.vclock[gpus[0]] = 500.0
    for i in range(200):
        table.fair.vtime[f"team/gone-{i:03}"] = float(i)
    waiter = table.enqueue("team/waits", gpus)  # behind everyone, but it waits: kept
    table.fair.vtime["team/waits"] = -1.0
    text = fairstate.dump(table, limit=2000)
    assert 1900 < len(text.encode()) <= 2000
    new = LeaseTable(clock=clock, policy=FairShare())
    assert fairstate.load(new, text) and new.fair is not None
    kept = set(new.fair.vtime)
    assert {"team/waits", "team/gone-199"} <= kept and "team/gone-000" not in kept
    assert all(
        new.fair.vtime[j] > max(table.fair.vtime[g] for g in set(table.fair.vtime) - kept)
        for j in kept - {"team/waits"}
    )
    assert new.fair.vclock == table.fair.vclock
    assert fairstate.dump(table, limit=50) == ""  # not even the GPUs fit: nothing (said once)
    assert waiter.waiter_id in table.waiters


def test_a_new_leader_charges_a_turn_it_took_over_at_its_jobs_own_duty_and_tier(
    tmp_path: Path,
) -> None:
    """rl's pods ask for a quarter of a GPU's time (`gpu-duty` 25), at priority tier 1. The
    leader changes during its turn; when rl yields to the new one, the fair policy charges the
    turn at rl's own duty (its virtual time grows by the seconds held / 0.25) and tier, as the
    old leader would have, not as a job of duty 100 in tier 0."""

    async def body() -> None:
        async with cluster(tmp_path) as (_nodes, view):
            for pod in ("team/rl-trainer", "team/rl-sampler"):
                namespace, job, member = view.members[pod]
                view.members[pod] = (namespace, job, replace(member, duty=25, tier=1))
            old = await leading(view)
            await old.acquire("team", "rl", "", timeout=5)
            old.step_down("the test's leader dies")
            later = [time.time() + 100.0]

            def fair_table() -> LeaseTable:
                return LeaseTable(clock=lambda: later[0], policy=FairShare())

            new = Arbiter(view, AgentLinks(TOKEN), fair_table, time.time)
            table = new.new_table()
            found = await recover(view, new.links, table, 2)
            new.lead(2, table, found)
            assert list(new.held) == ["team/rl"]
            granted_at = new.held["team/rl"].granted_at
            sft = asyncio.create_task(new.acquire("team", "sft", "", timeout=5))  # tier 0
            while not new.table.waiters:
                await asyncio.sleep(0.01)
            await new.yield_("team", "rl", "")
            await sft
            fair = new.table.fair
            assert fair is not None
            assert fair.vtime["team/rl"] == pytest.approx((later[0] - granted_at) / 0.25)
            # tier 0 waited through tier 1's turn: it is owed its minimum share of it
            assert fair.owed("n1/GPU-n1", 0) > 0
            await close(old)
            await close(new)

    run(body)

"""The fair policy's clocks survive a change of leader: dumped by one table, taken up by the
next, so the job that had the GPUs is not served first again."""

from __future__ import annotations

from agent.core.fair import FairShare
from agent.core.leases import LeaseTable
from coordinator import fairstate


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

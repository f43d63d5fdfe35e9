"""Kept turns on a real agent through the real clients: an owed tenant's loop starts its next
turn with no round trip to the agent, and a kept lease goes back to the agent when the caller
stays away (by the window), leaves (at once) or stops being owed (at once)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from agent.client import AsyncBaton, Baton, LeaseInfo
from agent.core import events as ev
from agent.core.fair import FairConfig
from tests.agent.server.test_anticipation_service import GPU, Waiting
from tests.harness.agent import AgentRunner
from tests.harness.pushes import Pushes

pytestmark = pytest.mark.timeout(60)

Owed = tuple[AgentRunner, Baton, Pushes[float], Waiting]


def owed_holder(
    workdir: str, window: float, gpus: list[str], step: float = 0.0, max_hold: float = 60.0
) -> Iterator[Owed]:
    """ "a" (duty 90) holds its turn on `gpus`, owed them over "b" (duty 10), which waits; the
    agent has told a's client how long it may keep the lease (`KeepTurn`). "b" held its turn
    for `step` (a fifth of the window unless said): "a" is owed 9 times that."""
    fair = FairConfig(anticipate_s=window)
    runner = AgentRunner(workdir, queue_policy="fair", fair=fair, max_hold=max_hold)
    runner.start()
    holder = Baton(runner.socket, gpus, name="a", gpu_duty=90)
    b = Baton(runner.socket, gpus, name="b", gpu_duty=10)
    keeps = Pushes(holder, "keep_turn", lambda m: m.keep_turn.until_s)
    try:
        b.acquire(timeout=10)
        a_waits = Waiting(runner, holder)  # "a" joins level with "b"'s turn
        time.sleep(step or window / 5)  # "b"'s step: by default "a" may hold 0.8 windows more
        b.yield_()
        a_waits.join(10)
        b_waits = Waiting(runner, b)
        keeps.wait_for(lambda until: until > 0)
        yield runner, holder, keeps, b_waits
    finally:
        holder.close()
        b.close()
        runner.stop()


def yield_kept(a: Baton) -> LeaseInfo:
    """`a` yields the turn it holds, and its client keeps the lease: returned."""
    held = a.lease
    assert held is not None
    a.yield_()
    assert a._core.kept is not None and a._core.kept.lease == held
    return held


@pytest.fixture
def owed(workdir: str, request: pytest.FixtureRequest) -> Iterator[Owed]:
    yield from owed_holder(workdir, request.param, [GPU])


@pytest.mark.parametrize("owed", [1.0], indirect=True)
def test_an_owed_loop_takes_its_next_turn_without_asking(owed: Owed) -> None:
    runner, a, _, b_waits = owed
    held = a.lease
    assert held is not None
    mark = runner.mark()
    for _ in range(5):  # five turns on the same lease: the agent hears of none of them
        a.yield_()
        again = a.acquire(timeout=10)
        assert again.lease_id == held.lease_id
    assert runner.inspect(lambda s: set(s.table.leases)) == {held.lease_id}
    a.yield_()  # and away: the lease goes back after the window, "b" is granted
    yielded = time.monotonic()
    # Once: the agent does not hold the GPU for "a" another window after the keeper's yield.
    assert b_waits.join(10) - yielded < 1.0 * 1.5
    runner.wait_event(lambda e: e.kind == ev.YIELDED and e.tenant_id == "local/a", since=mark)


@pytest.fixture
def owed_two(workdir: str) -> Iterator[Owed]:
    yield from owed_holder(workdir, 1.0, [GPU, "GPU-1"])


def test_an_ask_for_other_gpus_yields_the_kept_lease_before_it_asks(owed_two: Owed) -> None:
    # The kept lease is yielded first: on the session, while the new ask goes on the call link
    # (another connection), so the ask waits for the yield's answer. Were the ask read first,
    # the agent would refuse it (already holding); this run does not force that order.
    runner, a, _, _ = owed_two
    held = yield_kept(a)
    again = a.acquire(timeout=10, gpus=[GPU])
    assert again.lease_id != held.lease_id and again.gpus == (GPU,)
    assert held.lease_id not in runner.inspect(lambda s: set(s.table.leases))


@pytest.fixture
def owed_past_max_hold(workdir: str) -> Iterator[Owed]:
    """ "a" is owed 4.5 s, far more than the agent's maximum hold (1 s) and the window."""
    yield from owed_holder(workdir, 0.5, [GPU], step=0.5, max_hold=1.0)


def test_a_turn_is_never_taken_back_too_late_to_end_within_the_maximum_hold(
    owed_past_max_hold: Owed,
) -> None:
    """Under the agent's hold each of an owed loop's turns is a lease of its own, with the
    whole maximum hold before it; a kept turn is one lease with the others. So a turn that
    would run past the lease's maximum hold is not taken back on it: it is asked for afresh."""
    runner, a, keeps, _ = owed_past_max_hold
    held = a.lease
    assert held is not None and keeps.seen[-1] == pytest.approx(1.0)  # kept up to the maximum
    mark, leases = runner.mark(), {held.lease_id}
    for _ in range(4):  # turns of 0.3 s: the third would start 0.1 s before the maximum
        time.sleep(0.3)  # the step
        a.yield_()
        leases.add(a.acquire(timeout=10).lease_id)
    a.yield_()
    seen = runner.seen[mark : runner.mark()]
    revoked = [e for e in seen if e.kind == ev.REVOKED and e.tenant_id == "local/a"]
    assert not revoked, "a turn of 0.3 s was revoked (held past a maximum hold of 1 s)"
    assert len(leases) > 1  # asked for afresh: the agent, owed "a", granted it straight back


@pytest.mark.parametrize("owed", [5.0], indirect=True)
def test_a_kept_lease_goes_back_the_moment_its_tenant_leaves(owed: Owed) -> None:
    _, a, _, b_waits = owed
    yield_kept(a)
    left = time.monotonic()
    a.close()
    assert b_waits.join(10) - left < 2.0  # not the 5 s window


@pytest.mark.parametrize("owed", [5.0], indirect=True)
def test_a_kept_lease_goes_back_at_once_when_a_newcomer_comes_first(owed: Owed) -> None:
    runner, a, keeps, _ = owed
    held = yield_kept(a)
    c = Baton(runner.socket, [GPU], name="c", gpu_duty=10, priority=1)  # a higher tier
    try:
        asked = time.monotonic()
        c.acquire(timeout=10)
        assert time.monotonic() - asked < 2.0  # not the 5 s window
        assert keeps.seen[-1] == 0.0  # the agent withdrew the keep, and a's client yielded
        assert a._core.kept is None
        assert held.lease_id not in runner.inspect(lambda s: set(s.table.leases))
    finally:
        c.close()


async def owed_async(
    runner: AgentRunner, a: AsyncBaton, b: Baton, keeps: Pushes[float], window: float
) -> tuple[LeaseInfo, Waiting]:
    """ "a" (`AsyncBaton`, duty 90) holds its turn, owed it over "b" (duty 10), which waits;
    a's client has been told how long it may keep the lease. Its lease, and b's wait."""
    b.acquire(timeout=10)
    mark = runner.mark()
    first = asyncio.create_task(a.acquire(timeout=10))
    queued = lambda e: e.kind == ev.QUEUED and e.tenant_id == "local/a"  # noqa: E731
    await asyncio.to_thread(runner.wait_event, queued, 10, mark)
    await asyncio.sleep(window / 5)  # "b"'s step
    b.yield_()
    held = await first
    b_waits = await asyncio.to_thread(Waiting, runner, b)
    await asyncio.to_thread(keeps.wait_for, lambda until: until > 0)
    return held, b_waits


def test_the_asyncio_client_keeps_a_turn_and_gives_it_back(workdir: str) -> None:
    window = 1.0
    runner = AgentRunner(workdir, queue_policy="fair", fair=FairConfig(anticipate_s=window))
    runner.start()
    a = AsyncBaton(runner.socket, [GPU], name="a", gpu_duty=90)
    b = Baton(runner.socket, [GPU], name="b", gpu_duty=10)
    keeps = Pushes(a, "keep_turn", lambda m: m.keep_turn.until_s)

    async def owed_loop() -> float:
        held, b_waits = await owed_async(runner, a, b, keeps, window)
        for _ in range(3):
            await a.yield_()
            assert a._core.kept is not None
            assert (await a.acquire(timeout=10)).lease_id == held.lease_id
        await a.yield_()
        yielded = time.monotonic()
        granted = await asyncio.to_thread(b_waits.join, 10)
        await a.close()
        return granted - yielded

    try:
        assert asyncio.run(owed_loop()) < window * 1.5  # given back by the loop's timer, once
    finally:
        b.close()
        runner.stop()


def test_the_asyncio_client_gives_a_kept_turn_back_while_its_loop_is_blocked(workdir: str) -> None:
    """A caller whose loop does synchronous work between turns (a torch call, a data loader)
    blocks the loop's timer: its client's thread gives the kept lease back at the deadline, so
    the waiter is not kept out for as long as the work takes."""
    window = 0.5
    runner = AgentRunner(workdir, queue_policy="fair", fair=FairConfig(anticipate_s=window))
    runner.start()
    a = AsyncBaton(runner.socket, [GPU], name="a", gpu_duty=90)
    b = Baton(runner.socket, [GPU], name="b", gpu_duty=10)
    keeps = Pushes(a, "keep_turn", lambda m: m.keep_turn.until_s)

    async def blocked_loop() -> tuple[float, LeaseInfo, LeaseInfo]:
        held, b_waits = await owed_async(runner, a, b, keeps, window)
        await a.yield_()
        assert a._core.kept is not None
        yielded = time.monotonic()
        time.sleep(4 * window)  # the caller's own synchronous work, its loop blocked
        granted = await asyncio.to_thread(b_waits.join, 10)
        later = asyncio.create_task(a.acquire(timeout=10))  # behind "b" now, a turn of its own
        await asyncio.to_thread(b.yield_)
        again = await later
        await a.yield_()
        await a.close()
        return granted - yielded, held, again

    try:
        waited, held, again = asyncio.run(blocked_loop())
        assert waited < 2 * window, f'"b" waited {waited:.2f} s behind the blocked loop'
        assert again.lease_id != held.lease_id
        assert held.lease_id not in runner.inspect(lambda s: set(s.table.leases))
    finally:
        b.close()
        runner.stop()


def test_the_asyncio_client_never_takes_a_turn_back_too_late_for_the_maximum_hold(
    workdir: str,
) -> None:
    """As `test_a_turn_is_never_taken_back_too_late_to_end_within_the_maximum_hold`, on
    `AsyncBaton`: its own acquire and yield keep the same margin (`TURN_MARGIN`)."""
    window = 0.5
    fair = FairConfig(anticipate_s=window)
    runner = AgentRunner(workdir, queue_policy="fair", fair=fair, max_hold=1.0)
    runner.start()
    a = AsyncBaton(runner.socket, [GPU], name="a", gpu_duty=90)
    b = Baton(runner.socket, [GPU], name="b", gpu_duty=10)
    keeps = Pushes(a, "keep_turn", lambda m: m.keep_turn.until_s)

    async def owed_loop() -> tuple[set[str], int]:
        held, _ = await owed_async(runner, a, b, keeps, window * 5)  # b's step: 0.5 s
        assert keeps.seen[-1] == pytest.approx(1.0)  # kept up to the maximum
        mark, leases = runner.mark(), {held.lease_id}
        for _ in range(4):  # turns of 0.3 s: the third would start 0.1 s before the maximum
            await asyncio.sleep(0.3)  # the step
            await a.yield_()
            leases.add((await a.acquire(timeout=10)).lease_id)
        await a.yield_()
        await a.close()
        return leases, mark

    try:
        leases, mark = asyncio.run(owed_loop())
        seen = runner.seen[mark : runner.mark()]
        revoked = [e for e in seen if e.kind == ev.REVOKED and e.tenant_id == "local/a"]
        assert not revoked, "a turn of 0.3 s was revoked (held past a maximum hold of 1 s)"
        assert 1 < len(leases) < 5  # some taken back kept, some asked for afresh
    finally:
        b.close()
        runner.stop()

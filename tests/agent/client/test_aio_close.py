"""Closing an `AsyncBaton` while its other tasks use it: each of them gets the clear "closed"
error an acquire after close gets, never a `CancelledError` it did not ask for (asyncio code
takes that for its own cancellation: a TaskGroup swallows it, `asyncio.timeout` misreads it)."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import pytest

from agent.client import AsyncBaton, Baton, BatonError
from agent.parking.setup import ParkingOptions
from baton.contract.names import MIB, fake_gpu_uuid
from tests.agent.client.test_client_reconnect import hold_reconnect
from tests.harness.agent import AgentRunner

pytestmark = pytest.mark.timeout(60)
WAIT_S = 10.0
"""Bound on every wait in these tests."""
CLOSED = "this AsyncBaton client is closed"


def hold_first_connect(baton: AsyncBaton) -> asyncio.Event:
    """The client's first connect waits, after it began, until the test closes it: an agent
    slow to answer. Returns the event set once that connect is under way."""
    began, opens, never = asyncio.Event(), baton._open, asyncio.Event()

    async def held() -> None:
        began.set()
        await asyncio.wait_for(never.wait(), WAIT_S)  # (cancelled by close)
        await opens()

    baton._open = held  # type: ignore[method-assign]
    return began


def test_close_during_the_first_connect_says_closed_to_every_task_waiting(
    agent: AgentRunner,
) -> None:
    async def scenario() -> None:
        baton = AsyncBaton(agent.socket, ["GPU-0"], name="a")
        began = hold_first_connect(baton)
        calls: list[Any] = [baton.acquire(WAIT_S), baton.acquire(WAIT_S), baton.connect()]
        waiting = [asyncio.create_task(call) for call in calls]
        await asyncio.wait_for(began.wait(), WAIT_S)
        await asyncio.wait_for(baton.close(), WAIT_S)
        outcomes = await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), WAIT_S)
        for outcome in outcomes:
            assert isinstance(outcome, BatonError), repr(outcome)
            assert str(outcome).startswith(CLOSED)
        assert not any(task.cancelled() for task in waiting)

    asyncio.run(scenario())


def test_close_while_another_task_waits_for_a_turn_says_closed(agent: AgentRunner) -> None:
    """Not `AgentUnavailable` "lost the agent; reconnecting, retry the call": the agent is
    there, nothing reconnects, and a retry is refused as closed."""

    async def scenario() -> None:
        async with AsyncBaton(agent.socket, ["GPU-0"], name="holder") as holder:
            await holder.acquire(WAIT_S)
            baton = AsyncBaton(agent.socket, ["GPU-0"], name="waiter")
            await baton.connect()
            mark = agent.mark()
            waiting = [asyncio.create_task(baton.acquire(t)) for t in (WAIT_S, None)]
            queued = lambda e: e.kind == "queued" and e.tenant_id == "local/waiter"  # noqa: E731
            await asyncio.to_thread(agent.wait_event, queued, WAIT_S, mark)
            await asyncio.wait_for(baton.close(), WAIT_S)
            outcomes = await asyncio.wait_for(
                asyncio.gather(*waiting, return_exceptions=True), WAIT_S
            )
            for outcome in outcomes:
                assert isinstance(outcome, BatonError), repr(outcome)
                assert str(outcome).startswith(CLOSED), repr(outcome)

    asyncio.run(scenario())


def test_close_during_a_park_callback_lets_it_finish_and_answers_the_agent(workdir: str) -> None:
    """As `Baton.close()` does: the park in flight is neither cut short (its memory half moved)
    nor left unanswered (the agent never hears what it moved)."""
    gpu, seen = fake_gpu_uuid(0), []
    began, closing = asyncio.Event(), asyncio.Event()

    async def on_park(gpu: str) -> int:
        seen.append("park began")
        began.set()
        await asyncio.wait_for(closing.wait(), WAIT_S)
        await asyncio.to_thread(seen.append, "park moved")  # (the move, off the loop)
        return 60 * MIB

    async def on_restore(gpu: str) -> int:
        return 60 * MIB

    def next_tenant(socket: str) -> str:
        with Baton(socket, [gpu], name="next", gpu_memory_mib=60) as other:
            return other.acquire(WAIT_S).lease_id

    async def scenario(agent: AgentRunner) -> None:
        baton = AsyncBaton(
            agent.socket, [gpu], name="a", gpu_memory_mib=60, on_park=on_park,
            on_restore=on_restore, park_at_yield=False, keep_turns=False,
        )  # fmt: skip
        await baton.acquire(WAIT_S)
        await baton.yield_()
        other = asyncio.create_task(asyncio.to_thread(next_tenant, agent.socket))
        await asyncio.wait_for(began.wait(), WAIT_S)  # the agent asked it to park for "next"
        closing.set()  # the park goes on once close() has begun
        await asyncio.wait_for(baton.close(), WAIT_S)
        assert seen == ["park began", "park moved"]
        assert baton.parked.copy() == {gpu: 60 * MIB}
        await asyncio.wait_for(other, WAIT_S)
        registry = agent.agent.parking.metrics.registry  # type: ignore[union-attr]
        labels = {"backend": "app", "direction": "park"}  # the agent heard what it moved
        assert registry.get_sample_value("baton_moved_bytes_total", labels) == 60 * MIB

    parking = ParkingOptions(backend="app", fake_gpus="1x100")
    with AgentRunner(workdir, parking=parking) as agent:
        asyncio.run(scenario(agent))


def test_close_while_a_call_waits_for_the_reconnect_says_closed_at_once(workdir: str) -> None:
    """Not `AgentUnavailable` "still reconnecting" once the call's own timeout has passed."""
    runner = AgentRunner(workdir).start()

    class Heard(asyncio.Event):
        """The session's "answered" event, telling when a call waits on it."""

        def __init__(self) -> None:
            super().__init__()
            self.waited = asyncio.Event()

        async def wait(self) -> Literal[True]:
            self.waited.set()
            return await super().wait()

    async def scenario() -> None:
        baton = AsyncBaton(runner.socket, ["GPU-0"], name="a")
        await baton.connect()
        gate = hold_reconnect(baton)
        heard = baton._answered = Heard()
        heard.set()  # the session is open
        try:
            await asyncio.to_thread(runner.stop)  # the reconnect then waits at the gate
            call = asyncio.create_task(baton.acquire(60))
            await asyncio.wait_for(heard.waited.wait(), WAIT_S)
            loop = asyncio.get_running_loop()
            closed_at = loop.time()
            await asyncio.wait_for(baton.close(), WAIT_S)
            with pytest.raises(BatonError, match=CLOSED):
                await asyncio.wait_for(call, WAIT_S)
            assert loop.time() - closed_at < WAIT_S
        finally:
            gate.set()  # the held reconnect's thread ends

    try:
        asyncio.run(scenario())
    finally:
        runner.stop()

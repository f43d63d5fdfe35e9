"""An `AsyncBaton.acquire` given up on while it waits (its task cancelled, an `asyncio.timeout`
run out): it leaves the agent's queue before the client's next acquire asks, as `Baton`'s does,
so that acquire queues for the turn instead of being refused as "already waits"."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from agent.client import AsyncBaton
from tests.harness.agent import AgentRunner

pytestmark = pytest.mark.timeout(60)
WAIT_S = 10.0
"""Bound on every wait in these tests."""


async def queued(agent: AgentRunner, name: str, mark: int) -> None:
    """Return once the agent has queued `name`'s request (from `mark` on)."""
    match = lambda e: e.kind == "queued" and e.tenant_id == f"local/{name}"  # noqa: E731
    await asyncio.to_thread(agent.wait_event, match, WAIT_S, mark)


def test_an_acquire_timed_out_by_asyncio_timeout_then_asked_again_gets_the_turn(
    agent: AgentRunner,
) -> None:
    """A retry loop around `asyncio.timeout`: the retry was refused ("already waits")."""

    async def scenario() -> None:
        async with (
            AsyncBaton(agent.socket, ["GPU-0"], name="holder") as holder,
            AsyncBaton(agent.socket, ["GPU-0"], name="waiter") as waiter,
        ):
            await holder.acquire(WAIT_S)
            mark = agent.mark()

            async def expire(limit: asyncio.Timeout) -> None:  # once it waits in the queue
                await queued(agent, "waiter", mark)
                limit.reschedule(asyncio.get_running_loop().time())

            with pytest.raises(TimeoutError):
                async with asyncio.timeout(WAIT_S) as limit:
                    expiring = asyncio.create_task(expire(limit))
                    await waiter.acquire()
            await expiring
            again = asyncio.create_task(waiter.acquire(WAIT_S))
            await holder.yield_()
            assert await asyncio.wait_for(again, WAIT_S) == waiter.lease
            await waiter.yield_()

    asyncio.run(scenario())


def test_a_task_waiting_for_another_tasks_acquire_asks_itself_once_that_one_is_cancelled(
    agent: AgentRunner,
) -> None:
    """Tasks share a client's turn: the second waits for the first's grant; the first cancelled,
    the second asks for its own and gets it (it was refused)."""

    async def scenario() -> None:
        async with (
            AsyncBaton(agent.socket, ["GPU-0"], name="holder") as holder,
            AsyncBaton(agent.socket, ["GPU-0"], name="waiter") as waiter,
        ):
            await holder.acquire(WAIT_S)
            mark = agent.mark()
            first = asyncio.create_task(waiter.acquire())
            await queued(agent, "waiter", mark)
            second = asyncio.create_task(waiter.acquire(WAIT_S))
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(first, WAIT_S)
            await holder.yield_()
            assert await asyncio.wait_for(second, WAIT_S) == waiter.lease
            await waiter.yield_()

    asyncio.run(scenario())


def test_asyncio_run_ending_while_a_task_waits_for_a_turn_logs_no_error(
    agent: AgentRunner, caplog: pytest.LogCaptureFixture
) -> None:
    """`asyncio.run` cancels the task left waiting and ends the session: the withdrawal that
    finds the session gone has nothing to withdraw (it logged "Task exception was never
    retrieved" with an `AgentUnavailable` traceback)."""
    holder = AsyncBaton(agent.socket, ["GPU-0"], name="holder")

    async def scenario() -> None:
        await holder.acquire(WAIT_S)
        waiter = AsyncBaton(agent.socket, ["GPU-0"], name="waiter")
        mark = agent.mark()
        waiting = asyncio.create_task(waiter.acquire())  # left waiting as the program ends
        await queued(agent, "waiter", mark)
        assert not waiting.done()

    asyncio.run(scenario())
    gc.collect()  # (a task's unretrieved exception is logged as it is collected)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []

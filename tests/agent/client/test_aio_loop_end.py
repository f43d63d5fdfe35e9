"""An `AsyncBaton` whose event loop ends while a task is inside `async with baton.turn()`:
`asyncio.run` cancels the tasks it leaves behind, the client's session among them, and the
agent takes the turn back with the session. Nothing was lost, so nothing says so: the block
warned that the agent was lost ("reconnecting, retry the call") or that the client "does not
reconnect (reconnect=False)", and later calls said the same."""

from __future__ import annotations

import asyncio
import logging

import pytest

from agent.client import AsyncBaton, Baton, BatonError
from tests.harness.agent import AgentRunner

pytestmark = pytest.mark.timeout(60)
WAIT_S = 10.0
"""Bound on every wait in these tests."""
ENDED = "session ended with its event loop"


async def inside_a_turn(baton: AsyncBaton) -> asyncio.Task[None]:
    """A task inside `async with baton.turn()` until it is cancelled (once it is inside)."""
    inside = asyncio.Event()

    async def work() -> None:
        async with baton.turn(WAIT_S):
            inside.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(work())
    await asyncio.wait_for(inside.wait(), WAIT_S)
    return task


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("first", ["session", "block"])
def test_a_turn_open_as_its_tasks_are_cancelled_ends_quietly(
    agent: AgentRunner, caplog: pytest.LogCaptureFixture, first: str
) -> None:
    """As `asyncio.run` does with the tasks left as it returns: each cancelled at once, in
    whichever order (the session's first, or the block's, whose yield is then in flight)."""
    caplog.set_level(logging.WARNING, logger="baton.client")

    async def scenario() -> None:
        baton = AsyncBaton(agent.socket, ["GPU-0"], name="ends")
        block = await inside_a_turn(baton)
        assert baton._supervisor is not None
        tasks = [baton._supervisor, block] if first == "session" else [block, baton._supervisor]
        for task in tasks:
            task.cancel()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), WAIT_S)
        assert block.cancelled()
        with pytest.raises(BatonError, match=ENDED):
            await asyncio.wait_for(baton.acquire(WAIT_S), WAIT_S)
        assert baton.lease is None

    asyncio.run(scenario())
    assert warnings_of(caplog) == []
    with Baton(agent.socket, ["GPU-0"], name="next") as after:  # the agent took the turn back
        after.acquire(timeout=WAIT_S)


def test_asyncio_run_returning_with_a_task_inside_a_turn_warns_of_no_lost_agent(
    agent: AgentRunner, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="baton.client")
    baton = AsyncBaton(agent.socket, ["GPU-0"], name="ends")

    async def scenario() -> None:
        await inside_a_turn(baton)  # left inside as the program ends

    asyncio.run(scenario())
    assert warnings_of(caplog) == []
    with Baton(agent.socket, ["GPU-0"], name="next") as after:
        after.acquire(timeout=WAIT_S)

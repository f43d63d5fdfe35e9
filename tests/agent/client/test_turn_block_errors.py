"""A turn block that raises where its turn cannot be yielded (the agent gone, the client not
reconnecting): the caller hears the block's own error, and the failed yield is logged."""

from __future__ import annotations

import asyncio
import logging

import pytest

from agent.client import AsyncBaton, Baton, BatonError
from tests.harness.agent import AgentRunner

pytestmark = pytest.mark.timeout(60)
WAIT_S = 10.0


class StepFailed(Exception):
    """What the user's own step raised."""


def _told(raised: BaseException, caplog: pytest.LogCaptureFixture) -> None:
    assert not isinstance(raised.__context__, BatonError), raised.__context__
    said = [r.getMessage() for r in caplog.records if r.name == "baton.client"]
    assert any(
        m.startswith("a turn block raised StepFailed, and its turn could not be yielded: ")
        for m in said
    ), said


def test_the_blocking_clients_block_error_is_what_the_caller_hears(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "baton.client")
    runner = AgentRunner().start()
    try:
        baton = Baton(runner.socket, ["GPU-0"], name="t", reconnect=False)
        with pytest.raises(StepFailed, match="the step failed") as raised, baton.turn(WAIT_S):
            runner.stop()  # the yield at the block's end meets no agent
            raise StepFailed("the step failed")
        baton.close()
    finally:
        runner.stop()
    _told(raised.value, caplog)


def test_the_async_clients_block_error_is_what_the_caller_hears(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "baton.client")
    runner = AgentRunner().start()

    async def scenario() -> BaseException:
        baton = AsyncBaton(runner.socket, ["GPU-0"], name="t", reconnect=False)
        with pytest.raises(StepFailed, match="the step failed") as raised:
            async with baton.turn(WAIT_S):
                await asyncio.to_thread(runner.stop)
                raise StepFailed("the step failed")
        await baton.close()
        return raised.value

    try:
        error = asyncio.run(asyncio.wait_for(scenario(), 4 * WAIT_S))
    finally:
        runner.stop()
    _told(error, caplog)

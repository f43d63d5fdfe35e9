"""`AsyncBaton(transport="grpc")` keeps the promises the direct transport keeps: its session's
task ends with its event loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from agent.client import AsyncBaton
from tests.harness.agent import AgentRunner

pytestmark = pytest.mark.timeout(60)
WAIT_S = 10.0
"""Bound on every wait in these tests."""


def test_an_event_loop_that_ends_with_the_session_open_ends(agent: AgentRunner) -> None:
    """`asyncio.run` returns with the client neither closed nor yielded: the session's task is
    cancelled with the loop and ends (rather than take the cancel for the call's end, reconnect
    and serve the session for ever); the agent takes the turn back with the session."""
    baton = AsyncBaton(agent.socket, ["GPU-0"], name="ended", transport="grpc")

    async def hold() -> None:
        await baton.acquire(timeout=WAIT_S)

    returned = threading.Event()

    def run() -> None:
        asyncio.run(hold())
        returned.set()

    threading.Thread(target=run, daemon=True).start()
    assert returned.wait(WAIT_S), "asyncio.run did not return: the session's task went on"

    async def next_tenant() -> None:
        async with AsyncBaton(agent.socket, ["GPU-0"], name="next", transport="grpc") as other:
            await other.acquire(timeout=WAIT_S)
            await other.yield_()

    asyncio.run(asyncio.wait_for(next_tenant(), 2 * WAIT_S))

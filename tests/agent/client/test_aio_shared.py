"""Several coroutines of one event loop sharing one `AsyncBaton`: its first calls made at once
open one session between them, and it serves them all."""

from __future__ import annotations

import asyncio

import pytest

from agent.client import AsyncBaton
from tests.harness.agent import AgentRunner

pytestmark = pytest.mark.timeout(60)
WAIT_S = 10.0
"""Bound on every wait in these tests."""


def sessions(agent: AgentRunner) -> tuple[int, int]:
    """The agent's sessions of "local/a" open now, and how many opened or closed so far."""
    return agent.inspect(
        lambda s: (len(s.sessions._by_tenant.get("local/a", [])), s.sessions.revision)
    )


def test_first_calls_made_at_once_open_one_session(agent: AgentRunner) -> None:
    async def scenario() -> None:
        async with AsyncBaton(agent.socket, ["GPU-0"], name="b") as b:
            await b.connect()
            a = AsyncBaton(agent.socket, ["GPU-0"], name="a", keep_turns=False)
            before = sessions(agent)[1]
            await asyncio.wait_for(asyncio.gather(a.connect(), a.connect(), a.connect()), WAIT_S)
            assert sessions(agent) == (1, before + 1)  # one opened, none closed
            for _ in range(3):  # and it stays: no session of its own closes the other's
                await a.acquire(timeout=WAIT_S)
                await a.yield_()
            assert sessions(agent) == (1, before + 1)
            await a.close()

    asyncio.run(scenario())

"""Several coroutines of one event loop sharing one `AsyncBaton`: its first calls made at once
open one session between them, and it serves them all."""

from __future__ import annotations

import asyncio

import pytest

from agent.client import AcquireTimeout, AsyncBaton
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


def test_tasks_of_one_client_share_the_turn_one_waits_for(agent: AgentRunner) -> None:
    """As threads share one `Baton`: an acquire made while another task's waits takes the same
    grant, or raises `AcquireTimeout` when its own timeout passes first."""

    async def scenario() -> None:
        async with (
            AsyncBaton(agent.socket, ["GPU-0"], name="holder") as holder,
            AsyncBaton(agent.socket, ["GPU-0"], name="shared") as shared,
        ):
            await holder.acquire(timeout=WAIT_S)
            mark = agent.mark()
            first = asyncio.create_task(shared.acquire(WAIT_S))
            queued = lambda e: e.kind == "queued" and e.tenant_id == "local/shared"  # noqa: E731
            await asyncio.to_thread(agent.wait_event, queued, 5, mark)
            started = asyncio.get_running_loop().time()
            with pytest.raises(AcquireTimeout) as late:  # bounded by its own timeout
                await asyncio.wait_for(shared.acquire(timeout=0.2), WAIT_S)
            assert asyncio.get_running_loop().time() - started < 5
            assert late.value.reason == "another task's acquire on this client was still waiting"
            second = asyncio.create_task(shared.acquire(WAIT_S))
            await holder.yield_()
            leases = await asyncio.wait_for(asyncio.gather(first, second), WAIT_S)
            assert leases[0] == leases[1] == shared.lease
            await shared.yield_()

    asyncio.run(scenario())

"""An acquire while the client's revoked turn waits to be given back (it is `resuming`): it
waits for that turn and returns it, or fails at its own deadline saying what it waited for; the
turn, still queued first, comes back to the client later all the same."""

from __future__ import annotations

import asyncio

import pytest

from agent.client import AcquireTimeout, AsyncBaton
from tests.agent.client.resume_clients import Client, call, client, until
from tests.harness.agent import AgentRunner

pytestmark = pytest.mark.timeout(60)


def hold(agent: AgentRunner, seconds: float) -> None:
    agent.inspect(lambda service: setattr(service.table, "max_hold", seconds))


def joined(agent: AgentRunner) -> bool:
    """Whether an acquire waits at the agent for a revoked turn to be given back."""
    return agent.inspect(lambda service: bool(service.turns.resumes.joined))


async def revoked(agent: AgentRunner, x: Client, y: AsyncBaton) -> None:
    """x holds the GPU past the maximum hold while y waits: y gets it (for as long as it
    likes), x waits to be given it back."""
    await call(x.acquire)
    hold(agent, 60.0)
    await asyncio.wait_for(y.acquire(), 5)
    await until(lambda: x.resuming, "x hears of its revocation")


@pytest.mark.parametrize("kind", ["blocking", "asyncio"])
def test_an_acquire_while_resuming_returns_the_turn_given_back(workdir: str, kind: str) -> None:
    agent = AgentRunner(workdir, max_hold=0.3).start()

    async def scenario() -> None:
        x = client(kind, agent.socket, "x")
        y = AsyncBaton(agent.socket, ["GPU-0"], name="y", connect_timeout=5)
        try:
            await revoked(agent, x, y)
            theirs = asyncio.create_task(call(x.acquire, 10))
            await until(lambda: joined(agent) or theirs.done(), "x's acquire waits at the agent")
            await y.yield_()
            lease = await asyncio.wait_for(theirs, 10)
            assert x.lease == lease and not x.resuming
            [held] = agent.inspect(lambda service: service.table.leases_of("local/x"))
            assert lease.lease_id == held.lease_id
            assert not agent.inspect(lambda service: service.table.waiters)
            await call(x.yield_)
            assert not agent.inspect(lambda service: service.table.leases)
        finally:
            await call(x.close)
            await y.close()

    try:
        asyncio.run(asyncio.wait_for(scenario(), 45))
    finally:
        agent.stop()


@pytest.mark.parametrize("kind", ["blocking", "asyncio"])
def test_an_acquire_while_resuming_times_out_saying_so_and_the_turn_comes_back_later(
    workdir: str, kind: str
) -> None:
    agent = AgentRunner(workdir, max_hold=0.3).start()

    async def scenario() -> None:
        x = client(kind, agent.socket, "x")
        y = AsyncBaton(agent.socket, ["GPU-0"], name="y", connect_timeout=5)
        try:
            await revoked(agent, x, y)
            with pytest.raises(AcquireTimeout) as late:
                await call(x.acquire, 0.3)
            assert str(late.value).startswith(
                "no turn on [GPU-0] within the timeout; it waited for its revoked turn to be "
                "given back, which stays first in the queue for it"
            )
            assert late.value.reason.startswith("position 1 (GPU-0 behind holder local/y)")
            assert x.resuming and not joined(agent)
            await y.yield_()  # the turn is given back all the same
            await until(lambda: x.lease is not None, "x is given its turn back")
            [held] = agent.inspect(lambda service: service.table.leases_of("local/x"))
            assert x.lease is not None and x.lease.lease_id == held.lease_id
            await call(x.yield_)
        finally:
            await call(x.close)
            await y.close()

    try:
        asyncio.run(asyncio.wait_for(scenario(), 45))
    finally:
        agent.stop()

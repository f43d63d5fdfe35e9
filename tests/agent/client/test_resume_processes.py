"""Two processes of one tenant, each with its own session and its own turn on another GPU: a
yield of one process while its revoked turn waits to be given back gives up that turn only."""

from __future__ import annotations

import asyncio

import pytest

from agent.client import AsyncBaton, Baton
from tests.agent.client.resume_clients import call, until
from tests.harness.agent import AgentRunner, TenantProcess

pytestmark = pytest.mark.timeout(60)

BOTH = ["GPU-0", "GPU-1"]


def gpu(agent: AgentRunner, name: str) -> tuple[str | None, list[tuple[str, bool]]]:
    """The GPU's holder and its queue (tenant, resuming)."""
    state = agent.status()["gpus"][name]
    return state["holder"], [(w["tenant_id"], w["resuming"]) for w in state["queue"]]


@pytest.mark.parametrize("kind", [Baton, AsyncBaton])
@pytest.mark.parametrize("other_turn", ["held", "revoked"])
def test_a_yield_while_resuming_gives_up_only_this_processs_revoked_turn(
    workdir: str, kind: type[Baton | AsyncBaton], other_turn: str
) -> None:
    """x's process in the test holds GPU-0, its other process GPU-1; y's acquire revokes x's
    turn on GPU-0 (and z's the other's on GPU-1, where `other_turn` is revoked). The test's
    process yields: its resume leaves the queue, and the other process's turn (held, or waiting
    to be given back) stays its own."""
    agent = AgentRunner(workdir, max_hold=0.3).start()
    other = TenantProcess(agent.socket, "x", BOTH)

    async def scenario() -> None:
        x = kind(agent.socket, BOTH, name="x", connect_timeout=5)
        y = AsyncBaton(agent.socket, ["GPU-0"], name="y", connect_timeout=5)
        z = AsyncBaton(agent.socket, ["GPU-1"], name="z", connect_timeout=5)
        try:
            await call(x.acquire, 5, ["GPU-0"])
            took = await asyncio.to_thread(other.request, "acquire", gpus=["GPU-1"])
            assert took["ok"], took
            agent.inspect(lambda service: setattr(service.table, "max_hold", 60.0))  # not y's
            await asyncio.wait_for(y.acquire(), 5)
            await until(lambda: x.resuming, "x hears of its revocation")
            if other_turn == "revoked":
                await asyncio.wait_for(z.acquire(), 5)
                assert gpu(agent, "GPU-1") == ("local/z", [("local/x", True)])
            await call(x.yield_)
            assert gpu(agent, "GPU-0") == ("local/y", [])
            if other_turn == "held":
                assert gpu(agent, "GPU-1") == ("local/x", [])
                [held] = agent.inspect(lambda service: service.table.leases_of("local/x"))
                assert held.lease_id == took["lease_id"]
            else:
                assert gpu(agent, "GPU-1") == ("local/z", [("local/x", True)])
                await z.yield_()
                await until(lambda: gpu(agent, "GPU-1")[0] == "local/x", "the other's turn back")
            ended = await asyncio.to_thread(other.request, "yield")
            assert ended == {"ok": True}
            assert gpu(agent, "GPU-1") == (None, [])
        finally:
            await call(x.close)
            await y.close()
            await z.close()

    try:
        asyncio.run(asyncio.wait_for(scenario(), 45))
    finally:
        other.close()
        agent.stop()

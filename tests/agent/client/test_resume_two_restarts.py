"""A turn the agent gave back to a revoked tenant while none of its sessions was open, then an
agent restart before it reconnected: the turn given back still reaches its client."""

from __future__ import annotations

import asyncio

import pytest

from agent.client import AsyncBaton
from tests.agent.client.resume_clients import call, client, gate_reconnects, holder, until
from tests.agent.client.test_resume_restart import revoked
from tests.harness.agent import AgentRunner

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("kind", ["blocking", "asyncio"])
def test_a_turn_given_back_unheard_reaches_its_client_after_another_restart(
    workdir: str, kind: str
) -> None:
    first = AgentRunner(workdir, max_hold=0.3, reconnect_grace=30).start()
    second = AgentRunner(workdir, max_hold=60, reconnect_grace=30)
    third = AgentRunner(workdir, max_hold=60, reconnect_grace=30)

    async def scenario() -> None:
        x = client(kind, first.socket, "x")
        y = AsyncBaton(first.socket, ["GPU-0"], name="y", connect_timeout=5)
        try:
            await revoked(x, y)
            gate = gate_reconnects(x)
            await asyncio.to_thread(first.stop)
            await asyncio.to_thread(second.start)
            await asyncio.wait_for(y.yield_(), 10)  # x's turn is given back, x not there
            granted = await asyncio.to_thread(
                second.wait_event, lambda e: e.kind == "granted" and e.tenant_id == "local/x"
            )
            await asyncio.to_thread(second.stop)
            await asyncio.to_thread(third.start)
            gate.set()
            await until(
                lambda: x.lease is not None and x.lease.lease_id == granted.lease_id,
                "x holds the turn given back",
            )
            await call(x.yield_)
            assert holder(third) is None
        finally:
            await call(x.close)
            await y.close()

    try:
        asyncio.run(asyncio.wait_for(scenario(), 45))
    finally:
        first.stop()
        second.stop()
        third.stop()

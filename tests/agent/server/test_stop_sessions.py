"""An agent stopping with a tenant's gRPC session open closes that session before it says it
stopped: a session left open as the agent's process ends is cancelled there, which grpc logs as
an ERROR with tracebacks after the agent's last line."""

from __future__ import annotations

import asyncio
import threading

import pytest

from agent.client import AsyncBaton
from tests.harness.agent import AgentRunner

WAIT_S = 10.0
pytestmark = pytest.mark.timeout(60)


def test_a_grpc_session_is_closed_when_the_stop_returns(workdir: str) -> None:
    agent = AgentRunner(workdir, shutdown_grace=0.2).start()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    tenant = AsyncBaton(agent.socket, ["GPU-0"], name="t", transport="grpc", reconnect=False)

    async def stop() -> bool:
        """Stop the agent; whether the tenant's session was still open as the stop returned."""
        await agent.agent.stop()
        return agent.service.sessions.connected("local/t")

    try:
        asyncio.run_coroutine_threadsafe(tenant.acquire(), loop).result(WAIT_S)
        assert agent.service.sessions.connected("local/t")
        assert not agent.call(stop()), "the stop returned with the gRPC session still open"
    finally:
        asyncio.run_coroutine_threadsafe(tenant.close(), loop).result(WAIT_S)
        agent.stop()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(WAIT_S)
        loop.close()

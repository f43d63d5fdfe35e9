"""A turn the agent revoked and had yet to give back, across an agent restart: the restarted
agent keeps the revoked tenant first in the queue and gives the turn back to its client."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from agent.client import AsyncBaton
from tests.agent.client.resume_clients import (
    Client,
    call,
    client,
    gate_reconnects,
    holder,
    queue,
    until,
)
from tests.harness.agent import AgentRunner

pytestmark = pytest.mark.timeout(60)


async def revoked(x: Client, y: AsyncBaton) -> int:
    """x holds the GPU past the maximum hold while y waits: y gets it, x waits to be given it
    back. Returns y's fencing token."""
    await call(x.acquire)
    theirs = await asyncio.wait_for(y.acquire(), 5)
    await until(lambda: x.resuming, "x hears of its revocation")
    return theirs.fencing_tokens["GPU-0"]


@pytest.mark.parametrize("kind", ["blocking", "asyncio"])
@pytest.mark.parametrize("reconnects", ["before", "after"])
def test_a_turn_revoked_before_an_agent_restart_is_given_back_after_it(
    workdir: str, kind: str, reconnects: str, caplog: pytest.LogCaptureFixture
) -> None:
    """`reconnects`: whether x's session is back before or after y's yield gives x the turn."""
    caplog.set_level(logging.INFO, logger="agent.server.tenancy")
    first = AgentRunner(workdir, max_hold=0.3, reconnect_grace=30).start()
    second = AgentRunner(workdir, max_hold=0.3, reconnect_grace=30)

    async def scenario() -> None:
        x = client(kind, first.socket, "x")
        y = AsyncBaton(first.socket, ["GPU-0"], name="y", connect_timeout=5)
        try:
            token = await revoked(x, y)
            gate = gate_reconnects(x)
            if reconnects == "before":
                gate.set()
            await asyncio.to_thread(first.stop)
            await asyncio.to_thread(second.start)
            assert "restored 2 tenants and 1 lease, and 1 revoked turn to give back" in caplog.text
            assert queue(second) == [("local/x", True)]  # still first for the turn after
            await asyncio.wait_for(y.yield_(), 10)  # once y is back
            granted = await asyncio.to_thread(
                second.wait_event, lambda e: e.kind == "granted" and e.tenant_id == "local/x"
            )
            gate.set()
            await until(lambda: x.lease is not None, "x is given its turn back")
            assert x.lease is not None and not x.resuming
            assert x.lease.lease_id == granted.lease_id
            assert x.lease.fencing_tokens["GPU-0"] == token + 1
            await call(x.yield_)
            assert holder(second) is None and not queue(second)
        finally:
            await call(x.close)
            await y.close()

    try:
        asyncio.run(asyncio.wait_for(scenario(), 45))
    finally:
        first.stop()
        second.stop()


@pytest.mark.parametrize("kind", ["blocking", "asyncio"])
@pytest.mark.parametrize("given", [False, True])
def test_a_client_back_after_the_reconnect_grace_hears_its_turn_is_not_given_back(
    workdir: str, kind: str, given: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """`given`: whether y's yield gave x its turn back (unheard) before the grace ran out."""
    first = AgentRunner(workdir, max_hold=0.3, reconnect_grace=30).start()
    second = AgentRunner(workdir, max_hold=0.3, reconnect_grace=2)

    async def scenario() -> None:
        x = client(kind, first.socket, "x")
        y = AsyncBaton(first.socket, ["GPU-0"], name="y", connect_timeout=5)
        try:
            await revoked(x, y)
            gate = gate_reconnects(x)
            await asyncio.to_thread(first.stop)
            await asyncio.to_thread(second.start)
            if given:
                await asyncio.wait_for(y.yield_(), 10)
            await asyncio.to_thread(
                second.wait_event, lambda e: e.kind == "tenant_gone" and e.tenant_id == "local/x"
            )
            with caplog.at_level(logging.WARNING, logger="baton.client"):
                gate.set()
                await until(lambda: not x.resuming, "x hears its turn is not given back")
            assert "no session of local/x was open within --reconnect-grace (2 s)" in caplog.text
            await call(x.yield_)  # ends nothing, quietly
            assert x.lease is None and not x.resuming
            again = await call(x.acquire, 10)  # a new turn, at the back of the queue
            assert x.lease == again
            await call(x.yield_)
        finally:
            await call(x.close)
            await y.close()

    try:
        asyncio.run(asyncio.wait_for(scenario(), 45))
    finally:
        first.stop()
        second.stop()


def lose_revocations(tenant: Client) -> None:
    """The client never hears a revocation (as if the push were lost as the agent stopped)."""
    pushed = tenant._core.pushed

    def deaf(message: Any) -> Any:
        return None if message.WhichOneof("kind") == "revoked" else pushed(message)

    tenant._core.pushed = deaf  # type: ignore[method-assign]


@pytest.mark.parametrize("kind", ["blocking", "asyncio"])
@pytest.mark.parametrize("reconnects", ["before", "after"])
def test_a_client_that_missed_its_revocation_takes_up_the_turn_given_back_after_a_restart(
    workdir: str, kind: str, reconnects: str
) -> None:
    """x's client still believes it holds its turn as it reconnects: its renewal hears that the
    turn was revoked and is being given back (`reconnects` before y's yield gives it back), or
    is answered with the turn given back (after)."""
    first = AgentRunner(workdir, max_hold=0.3, reconnect_grace=30).start()
    second = AgentRunner(workdir, max_hold=60, reconnect_grace=30)

    async def scenario() -> None:
        x = client(kind, first.socket, "x")
        y = AsyncBaton(first.socket, ["GPU-0"], name="y", connect_timeout=5)
        try:
            await call(x.acquire)
            lose_revocations(x)
            first.inspect(lambda service: setattr(service.table, "max_hold", 60.0))  # not y's
            await asyncio.wait_for(y.acquire(), 5)  # once x's turn is revoked
            assert x.lease is not None and not x.resuming  # it never heard
            gate = gate_reconnects(x)
            await asyncio.to_thread(first.stop)
            await asyncio.to_thread(second.start)
            if reconnects == "before":
                gate.set()
                await until(lambda: x.resuming, "x hears its turn is being given back")
                assert x.lease is None
            await asyncio.wait_for(y.yield_(), 10)
            granted = await asyncio.to_thread(
                second.wait_event, lambda e: e.kind == "granted" and e.tenant_id == "local/x"
            )
            gate.set()
            await until(
                lambda: x.lease is not None and x.lease.lease_id == granted.lease_id,
                "x holds the turn given back",
            )
            assert not x.resuming
            await call(x.yield_)
            assert holder(second) is None and not queue(second)
        finally:
            await call(x.close)
            await y.close()

    try:
        asyncio.run(asyncio.wait_for(scenario(), 45))
    finally:
        first.stop()
        second.stop()

"""A turn revoked while its holder's session was down and the agent stayed up: another process
of the tenant kept a session open (so the tenant stayed), the holder's client never heard the
revocation, and it takes the turn given back up as it reconnects."""

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
from tests.harness.agent import AgentRunner, TenantProcess

pytestmark = pytest.mark.timeout(60)


def drop_session(tenant: Client) -> None:
    """Break the client's session from its side (it reconnects, as after a network blip)."""
    if isinstance(tenant, AsyncBaton):
        assert tenant._link is not None
        tenant._lost(tenant._link)
    else:
        assert tenant._sock is not None
        tenant._lost(tenant._sock)


@pytest.mark.parametrize("kind", ["blocking", "asyncio"])
@pytest.mark.parametrize("reconnects", ["before", "after"])
def test_a_holder_whose_session_was_down_at_its_revocation_takes_up_the_turn_given_back(
    workdir: str, kind: str, reconnects: str
) -> None:
    """x's client still believes it holds its turn as it reconnects: its renewal hears that the
    turn was revoked and is being given back (`reconnects` before y's yield gives it back), or
    is answered with the turn given back (after)."""
    agent = AgentRunner(workdir, max_hold=0.3).start()
    other = TenantProcess(agent.socket, "x", ["GPU-0"])  # x's other process: its session stays

    async def scenario() -> None:
        x = client(kind, agent.socket, "x")
        y = AsyncBaton(agent.socket, ["GPU-0"], name="y", connect_timeout=5)
        try:
            revoked = await call(x.acquire)
            agent.inspect(lambda service: setattr(service.table, "max_hold", 60.0))  # not y's
            gate = gate_reconnects(x)
            since = agent.mark()
            drop_session(x)
            await asyncio.to_thread(
                agent.wait_event,
                lambda e: e.kind == "disconnected" and e.tenant_id == "local/x",
                10,
                since,
            )
            await asyncio.wait_for(y.acquire(), 5)  # once x's turn is revoked, unheard by x
            assert x.lease == revoked and not x.resuming
            if reconnects == "before":
                gate.set()
                await until(lambda: x.resuming, "x hears its turn is being given back")
                assert x.lease is None
            since = agent.mark()
            await asyncio.wait_for(y.yield_(), 10)
            granted = await asyncio.to_thread(
                agent.wait_event,
                lambda e: e.kind == "granted" and e.tenant_id == "local/x",
                10,
                since,
            )
            gate.set()
            await until(
                lambda: x.lease is not None and x.lease.lease_id == granted.lease_id,
                "x holds the turn given back",
            )
            assert not x.resuming
            await call(x.yield_)
            assert holder(agent) is None and not queue(agent)
        finally:
            await call(x.close)
            await y.close()

    try:
        asyncio.run(asyncio.wait_for(scenario(), 45))
    finally:
        other.close()
        agent.stop()


def lose_next_revocation(tenant: Client) -> list[Any]:
    """The client does not hear the next revocation pushed to it (as if its session were down);
    the list returned holds it once it arrived."""
    pushed: Any = tenant._core.pushed
    lost: list[Any] = []

    def deaf(message: Any) -> Any:
        if message.WhichOneof("kind") == "revoked" and not lost:
            lost.append(message)
            return None
        return pushed(message)

    tenant._core.pushed = deaf  # type: ignore[method-assign]
    return lost


@pytest.mark.parametrize("kind", ["blocking", "asyncio"])
@pytest.mark.parametrize("heard", [True, False])
def test_a_client_whose_only_session_broke_while_it_was_revoked_hears_the_turn_is_not_given_back(
    workdir: str, kind: str, heard: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """x's last session ends while its revoked turn waits to be given back: the agent drops the
    tenant's turns and places (it cannot tell a blip from an exit). x's client, reconnected,
    hears that the turn is not given back, whether it heard of the revocation or not: its yield
    ends nothing, its next acquire queues."""
    agent = AgentRunner(workdir, max_hold=0.3)
    agent.start()

    async def scenario() -> None:
        x = client(kind, agent.socket, "x")
        y = AsyncBaton(agent.socket, ["GPU-0"], name="y", connect_timeout=5)
        try:
            await call(x.acquire)
            lost = [] if heard else lose_next_revocation(x)
            agent.inspect(lambda service: setattr(service.table, "max_hold", 60.0))  # not y's
            await asyncio.wait_for(y.acquire(), 5)
            if heard:
                await until(lambda: x.resuming, "x hears of its revocation")
            else:
                await until(lambda: bool(lost), "the revocation reaches x's client, unheard")
                assert x.lease is not None and not x.resuming
            gate = gate_reconnects(x)
            since = agent.mark()
            drop_session(x)
            await asyncio.to_thread(
                agent.wait_event,
                lambda e: e.kind == "tenant_gone" and e.tenant_id == "local/x",
                10,
                since,
            )
            assert queue(agent) == []
            with caplog.at_level(logging.WARNING, logger="baton.client"):
                gate.set()
                await until(
                    lambda: "the last session of local/x ended" in caplog.text,
                    "x hears its turn is not given back",
                )
            assert x.lease is None and not x.resuming
            await call(x.yield_)  # ends nothing, quietly
            await y.yield_()
            again = await call(x.acquire, 5)  # a new turn
            assert x.lease == again and holder(agent) == "local/x"
            await call(x.yield_)
        finally:
            await call(x.close)
            await y.close()

    try:
        asyncio.run(asyncio.wait_for(scenario(), 45))
    finally:
        agent.stop()


@pytest.mark.parametrize("ends", ["killed", "closed"])
def test_a_withdrawn_turn_is_kept_for_the_tenants_next_session_only_while_its_process_lives(
    workdir: str, ends: str
) -> None:
    """x's only process's session ends while its revoked turn waits to be given back: x is
    dropped, its resume withdrawn for its next session to hear. That word is kept while x's
    process lives (it `closed` its client: it may open another) and forgotten once it has
    exited (at once if it was `killed`): nobody of x is left to come back."""
    agent = AgentRunner(workdir, max_hold=0.3).start()
    x = TenantProcess(agent.socket, "x", ["GPU-0"])

    def withdrawn() -> list[str]:
        return agent.inspect(lambda service: list(service.turns.resumes.withdrawn))

    async def scenario() -> None:
        y = AsyncBaton(agent.socket, ["GPU-0"], name="y", connect_timeout=5)
        try:
            took = await asyncio.to_thread(x.request, "acquire")
            assert took["ok"], took
            agent.inspect(lambda service: setattr(service.table, "max_hold", 60.0))  # not y's
            await asyncio.wait_for(y.acquire(), 5)
            assert queue(agent) == [("local/x", True)]
            since = agent.mark()
            if ends == "killed":
                await asyncio.to_thread(x.kill)
            else:
                assert await asyncio.to_thread(x.request, "close") == {"ok": True}
            await asyncio.to_thread(
                agent.wait_event,
                lambda e: e.kind == "tenant_gone" and e.tenant_id == "local/x",
                10,
                since,
            )
            assert queue(agent) == []
            if ends == "closed":
                assert withdrawn() == ["local/x"]  # its process may open a session again
                await asyncio.to_thread(x.close)
            await until(lambda: not withdrawn(), "the withdrawal nobody can hear is forgotten")
        finally:
            await y.close()

    try:
        asyncio.run(asyncio.wait_for(scenario(), 45))
    finally:
        x.close()
        agent.stop()

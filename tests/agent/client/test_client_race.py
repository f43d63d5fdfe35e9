"""A revoked holder whose yield crosses the agent's messages keeps a true picture of its turn.

The agent's `revoked` and `granted` pushes are held back in the client (as a slow network
would) until the tenant has yielded, so each crossing happens every run, not by chance.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from agent.client import AsyncBaton, Baton
from agent.server.session_stream import SessionStream
from baton._pb import agent_pb2 as pb
from tests.agent.client.test_resume_restart import call, until
from tests.harness.agent import AgentRunner


@pytest.fixture
def agent(workdir: str) -> Iterator[AgentRunner]:
    runner = AgentRunner(workdir, max_hold=0.2).start()
    yield runner
    runner.stop()


class HeldPushes:
    """Holds back the agent's pushes of the given kinds until `deliver()`."""

    def __init__(self, client: AsyncBaton, *kinds: str) -> None:
        self.client, self.kinds = client, kinds
        self.held: list[pb.AgentMessage] = []
        self.arrived = {kind: asyncio.Event() for kind in kinds}
        self._deliver = client._on_message
        client._on_message = self._intercept  # type: ignore[method-assign]

    def _intercept(self, message: pb.AgentMessage) -> None:
        kind = message.WhichOneof("kind")
        if kind in self.kinds:
            self.held.append(message)
            self.arrived[kind].set()
        else:
            self._deliver(message)

    def deliver(self) -> None:
        for message in self.held:
            self._deliver(message)
        self.held.clear()


async def revoke_then_resume(agent: AgentRunner, x: AsyncBaton, y: AsyncBaton) -> str:
    """x holds past its maximum while y waits; y takes and ends a turn; x's turn is given back."""
    first = await x.acquire()
    lease = await asyncio.wait_for(y.acquire(), 5)
    await y.yield_()
    await asyncio.to_thread(
        agent.wait_event, lambda e: e.kind == "granted" and e.tenant_id == "local/x", 5
    )
    assert lease.lease_id != first.lease_id
    return first.lease_id


def holder(agent: AgentRunner) -> str | None:
    return agent.status()["gpus"]["GPU-0"]["holder"]


def test_a_turn_given_back_after_the_holder_yielded_is_not_taken(agent: AgentRunner) -> None:
    async def scenario() -> None:
        async with (
            AsyncBaton(agent.socket, ["GPU-0"], name="x") as x,
            AsyncBaton(agent.socket, ["GPU-0"], name="y") as y,
        ):
            pushes = HeldPushes(x, "granted")
            await revoke_then_resume(agent, x, y)
            await asyncio.wait_for(pushes.arrived["granted"].wait(), 5)
            assert x.resuming and x.lease is None
            await x.yield_()  # ends the turn the agent gave back, before x has heard of it
            assert holder(agent) is None
            pushes.deliver()
            assert x.lease is None and not x.resuming
            again = await asyncio.wait_for(x.acquire(), 5)
            assert holder(agent) == "local/x"
            await x.yield_()  # a lease the agent knows: no LeaseLost
            assert again.lease_id not in {m.granted.lease_id for _, m in pushes.held}

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_yield_that_crosses_its_revocation_also_ends_the_turn_given_back(
    agent: AgentRunner,
) -> None:
    async def scenario() -> None:
        async with (
            AsyncBaton(agent.socket, ["GPU-0"], name="x") as x,
            AsyncBaton(agent.socket, ["GPU-0"], name="y") as y,
        ):
            pushes = HeldPushes(x, "revoked", "granted")
            await revoke_then_resume(agent, x, y)
            await asyncio.wait_for(pushes.arrived["granted"].wait(), 5)
            assert x.lease is not None  # x has heard of neither the revocation nor the resume
            await x.yield_()
            assert holder(agent) is None, "the turn given back to x ends with x's yield"
            pushes.deliver()
            assert x.lease is None and not x.resuming
            await asyncio.wait_for(x.acquire(), 5)
            await x.yield_()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def cross_next_renewal(agent: AgentRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent handles the next renewal it reads right after its next revocation, in the
    step before the session writes the revocation's push (a renewal read in the same loop step
    as the revocation meets it so by chance; here it does every run)."""
    handle = SessionStream._handle
    arrived = asyncio.Event()
    go: list[asyncio.Future[None]] = []

    async def held_renewal(stream: SessionStream, request: pb.Request) -> None:
        if request.WhichOneof("kind") == "renew" and not arrived.is_set():
            go.append(asyncio.get_running_loop().create_future())
            arrived.set()
            await go[0]
        await handle(stream, request)

    preparer = agent.service.state.preparer
    revoke = preparer.revoke

    async def revoke_then_let_it_in(tenant_id: str, gpus: Sequence[str], *asks: Any) -> bool:
        parked = await revoke(tenant_id, gpus, *asks)
        await arrived.wait()
        if not go[0].done():
            go[0].set_result(None)  # the renewal's turn comes before the push's write
        return parked

    monkeypatch.setattr(SessionStream, "_handle", held_renewal)
    monkeypatch.setattr(preparer, "revoke", revoke_then_let_it_in)


@pytest.mark.parametrize("kind", ["blocking", "asyncio"])
def test_a_renewal_that_crosses_its_revocation_leaves_the_holder_resuming(
    agent: AgentRunner, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """x's renewal reaches the agent just as its turn is revoked: x hears the revocation before
    the renewal's answer, resumes, and takes its turn back after y's."""
    cross_next_renewal(agent, monkeypatch)

    async def scenario() -> None:
        x: Baton | AsyncBaton
        if kind == "blocking":
            x = Baton(agent.socket, ["GPU-0"], name="x", renew_interval=0.1)
        else:
            x = AsyncBaton(agent.socket, ["GPU-0"], name="x", renew_interval=0.1)
        y = AsyncBaton(agent.socket, ["GPU-0"], name="y", renew_interval=60)
        try:
            await call(x.acquire)
            agent.inspect(lambda service: setattr(service.table, "max_hold", 60.0))  # not y's
            lease = await asyncio.wait_for(y.acquire(), 5)  # once x's turn is revoked
            await until(lambda: x.resuming, "x resumes its revoked turn")
            since = agent.mark()
            await y.yield_()
            granted = await asyncio.to_thread(
                agent.wait_event,
                lambda e: e.kind == "granted" and e.tenant_id == "local/x",
                5,
                since,
            )
            await until(lambda: x.lease is not None, "x takes its turn back")
            assert x.lease is not None and x.lease.lease_id == granted.lease_id != lease.lease_id
            await call(x.yield_)
            assert holder(agent) is None
        finally:
            await call(x.close)
            await y.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))

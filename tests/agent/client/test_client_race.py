"""A revoked holder whose yield crosses the agent's messages keeps a true picture of its turn.

The agent's `revoked` and `granted` pushes are held back in the client (as a slow network
would) until the tenant has yielded, so each crossing happens every run, not by chance.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from agent.client import AsyncBaton
from baton._pb import agent_pb2 as pb
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

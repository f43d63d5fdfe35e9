"""`close()` called from inside the restore that `acquire()` runs as its grant arrives, while
a park the agent asked for (a revocation's) waits behind that restore: close does not wait for
the callback it is called from, nor for the one that cannot start before that one ends."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agent.client import AsyncBaton, Baton, LeaseInfo
from agent.parking.setup import ParkingOptions
from baton._pb import agent_pb2 as pb
from baton.contract.names import MIB
from tests.agent.client.test_client_close import GPU, WAIT_S
from tests.agent.client.test_restore_with_grant import queued_behind, switch, taking
from tests.harness.agent import AgentRunner

pytestmark = pytest.mark.timeout(60)
QUICK_S = 2.5
"""Well under the waits a close made from inside a callback must not make (the blocking
client's 5 s join of its reader, the asyncio one's 60 s for the callbacks in flight)."""


@pytest.fixture
def revoking_agent(workdir: str) -> Iterator[AgentRunner]:
    """A 100 MiB GPU that holds one 60 MiB tenant, and turns revoked after 0.5 s when another
    waits: the revocation's park reaches a tenant still restoring with its grant."""
    options = ParkingOptions(backend="app", fake_gpus="1x100")
    with AgentRunner(workdir, parking=options, max_hold=0.5) as runner:
        yield runner


def test_an_async_close_inside_acquires_restore_is_not_held_by_a_park_queued_behind_it(
    revoking_agent: AgentRunner,
) -> None:
    agent = revoking_agent
    took: list[float] = []

    async def scenario() -> None:
        restoring, park_asked = asyncio.Event(), asyncio.Event()
        restores = 0

        async def quick(gpu: str) -> int:
            return 60 * MIB

        async def restore(gpu: str) -> int:
            nonlocal restores
            restores += 1
            if restores == 1:  # x's restore with its grant: the revocation's park arrives
                restoring.set()
                await asyncio.wait_for(park_asked.wait(), WAIT_S)
                began = time.monotonic()
                await asyncio.wait_for(x.close(), WAIT_S)
                took.append(time.monotonic() - began)
            return 60 * MIB

        def client(name: str, on_restore: Any) -> AsyncBaton:
            return AsyncBaton(
                agent.socket, [GPU], name=name, gpu_memory_mib=60,
                on_park=quick, on_restore=on_restore, park_at_yield=False, keep_turns=False,
            )  # fmt: skip

        x, y = client("x", restore), client("y", quick)
        run = x._run_callback

        async def arriving(request: pb.Callback) -> None:
            if request.action == "park" and restores:
                park_asked.set()
            await run(request)

        x._run_callback = arriving  # type: ignore[method-assign]
        try:
            await x.connect()
            await y.connect()
            taken = await queued_behind(agent, x, y)
            await x.yield_()
            await asyncio.wait_for(taken, WAIT_S)  # y holds; x is parked
            taken = await queued_behind(agent, y, x)
            await y.yield_()  # x's grant leaves its restore to it
            await asyncio.wait_for(restoring.wait(), WAIT_S)
            # y waits: x's turn is revoked after 0.5 s, during its restore, which then closes x
            outcome = await asyncio.wait_for(
                asyncio.gather(taken, y.acquire(WAIT_S), return_exceptions=True), WAIT_S
            )
            assert not isinstance(outcome[0], asyncio.CancelledError), repr(outcome[0])
            assert x.lease is None  # closed: the agent took the turn back...
            assert isinstance(outcome[1], LeaseInfo), repr(outcome[1])  # ...and y has it
        finally:
            await asyncio.wait_for(x.close(), WAIT_S)
            await asyncio.wait_for(y.close(), WAIT_S)

    asyncio.run(scenario())
    assert len(took) == 1 and took[0] < QUICK_S, took


def test_a_blocking_close_inside_acquires_restore_is_not_held_by_a_park_queued_behind_it(
    revoking_agent: AgentRunner,
) -> None:
    agent = revoking_agent
    restoring, park_asked = threading.Event(), threading.Event()
    took: list[float] = []
    restores = 0

    def quick(gpu: str) -> int:
        return 60 * MIB

    def restore(gpu: str) -> int:
        nonlocal restores
        restores += 1
        if restores == 1:  # a's restore with its grant: the revocation's park arrives
            restoring.set()
            assert park_asked.wait(WAIT_S), "a was never revoked during its restore"
            began = time.monotonic()
            clients["a"].close()
            took.append(time.monotonic() - began)
        return 60 * MIB

    def client(name: str, on_restore: Any) -> Baton:
        return Baton(
            agent.socket, [GPU], name=name, gpu_memory_mib=60,
            on_park=quick, on_restore=on_restore, park_at_yield=False, keep_turns=False,
        )  # fmt: skip

    clients = {"a": client("a", restore), "b": client("b", quick)}
    runner = clients["a"]._callbacks_run
    run = runner._run

    def arriving(request: pb.Callback, *rest: Any) -> Any:
        if request.action == "park" and restoring.is_set():
            park_asked.set()  # (then it waits for the restore to end)
        return run(request, *rest)

    runner._run = arriving  # type: ignore[method-assign,assignment]
    try:
        switch(agent, clients, "a", "b")  # b holds; a is parked
        taker = taking(agent, clients["a"], lambda: clients["a"].acquire(WAIT_S))
        clients["b"].yield_()  # a is granted; its restore is left to it
        assert restoring.wait(WAIT_S), "a's grant did not leave its restore to it"
        b_takes = taking(agent, clients["b"], lambda: clients["b"].acquire(WAIT_S))
        for thread in (taker, b_takes):
            thread.join(WAIT_S)
            assert not thread.is_alive()
        assert clients["a"].lease is None  # closed: the agent took the turn back...
        assert clients["b"].lease is not None  # ...and b has it
    finally:
        park_asked.set()
        for each in clients.values():
            each.close()
    assert len(took) == 1 and took[0] < QUICK_S, took

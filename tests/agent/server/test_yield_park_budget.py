"""The host budget holds what holders were told to park at their yield (`ParkAtYield`): a grant
on another GPU does not spend it meanwhile, so the park at the yield keeps parked memory within
the budget. Real agent (app method, two 100 MiB GPUs), real clients."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from agent.client import Baton
from agent.client.errors import AcquireTimeout
from agent.parking.setup import ParkingOptions
from baton._pb import agent_pb2 as pb
from baton.contract.names import MIB, fake_gpu_uuid
from tests.agent.client.test_park_at_yield import hints_of
from tests.agent.client.test_restore_with_grant import Recorded, taking
from tests.harness.agent import AgentRunner

pytestmark = pytest.mark.timeout(60)

GPU0, GPU1 = fake_gpu_uuid(0), fake_gpu_uuid(1)
WAIT_S = 20.0
BUDGET_MIB = 100


@pytest.fixture
def agent(workdir: str) -> Iterator[AgentRunner]:
    """Two GPUs that each hold one 60 MiB tenant; host memory for one parked tenant."""
    options = ParkingOptions(backend="app", fake_gpus="2x100", host_memory_budget_mib=BUDGET_MIB)
    with AgentRunner(workdir, queue_policy="fifo", parking=options) as runner:
        yield runner


def tenant(agent: AgentRunner, name: str, gpu: str, recorded: Recorded) -> Baton:
    return Baton(
        agent.socket,
        [gpu],
        name=name,
        gpu_memory_mib=60,
        on_park=recorded.park,
        on_restore=recorded.restore,
        park_at_yield=True,
    )


def late(client: Baton) -> None:
    """The client takes in no hint from now on: one that changes is still on its way."""
    pushed = client._core.pushed

    def drop_hints(message: pb.AgentMessage) -> pb.Request | None:
        return None if message.WhichOneof("kind") == "park_at_yield" else pushed(message)

    client._core.pushed = drop_hints  # type: ignore[method-assign]


def test_a_grant_on_another_gpu_leaves_the_budget_a_hinted_holder_parks_into(
    agent: AgentRunner,
) -> None:
    recorded = {name: Recorded() for name in "abxy"}
    gpus = {"a": GPU0, "b": GPU0, "x": GPU1, "y": GPU1}
    clients = {name: tenant(agent, name, gpus[name], recorded[name]) for name in "abxy"}
    a, hints = clients["a"], hints_of(clients["a"])
    x_park = recorded["x"].park

    def a_yields_during_the_park_of_x(gpu: str) -> int:
        a.yield_()  # a acts on its hint meanwhile
        return x_park(gpu)

    recorded["x"].park = a_yields_during_the_park_of_x  # type: ignore[method-assign]
    try:
        clients["x"].acquire(WAIT_S)  # x resident on GPU1, idle after its turn
        clients["x"].yield_()
        a.acquire(WAIT_S)
        taker = taking(agent, clients["b"], lambda: clients["b"].acquire(WAIT_S))
        hints.wait((GPU0,))  # a is to park its 60 MiB as it yields: the budget's 100 hold it
        late(a)  # a's yield may cross a hint withdrawn meanwhile: a acts on the one it has
        # y's turn on GPU1 would park x: 60 MiB more, which the budget no longer holds.
        timed_out: list[AcquireTimeout] = []

        def ask() -> None:
            try:
                clients["y"].acquire(2.0)
            except AcquireTimeout as exc:
                timed_out.append(exc)

        asking = threading.Thread(target=ask)
        asking.start()
        asking.join(WAIT_S)
        assert not asking.is_alive()
        if a.lease is not None:
            a.yield_()  # parks itself, as told
        taker.join(WAIT_S)
        assert not taker.is_alive(), "b was never granted"
        residency = agent.status()["residency"]
        assert residency["parked_bytes"] <= BUDGET_MIB * MIB, residency
        assert recorded["x"].calls == [] and timed_out, "y's turn parked x past the budget"
        assert [call for call, _ in recorded["a"].calls] == ["park"]
    finally:
        for client in clients.values():
            client.close()

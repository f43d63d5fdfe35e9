"""A tenant of several processes that park themselves (the ranks of a `torchrun` in one pod, or
two clients in one process: two `BatonCallback()`s, all one tenant): the turn of another tenant
that needs the room parks every one of them, not only the first to connect, and counts their
bytes together; the tenant's next turn brings each back, and a process that parked nothing
(it joined after the park) does not fail that restore."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from agent.client import Baton
from agent.client.torch import TorchParker
from agent.parking.setup import ParkingOptions
from baton.contract.names import fake_gpu_uuid
from tests.harness.agent import AgentRunner

pytestmark = pytest.mark.timeout(60)
GPU = fake_gpu_uuid(0)
ELEMENTS = 1 << 18
"""Each process's tensor: 1 MiB of float32."""


@pytest.fixture
def agent(workdir: str) -> Iterator[AgentRunner]:
    """An app-method agent whose 100 MiB GPU holds one 60 MiB tenant."""
    parking = ParkingOptions(backend="app", fake_gpus="1x100", simulated_inventory=True)
    with AgentRunner(workdir, parking=parking) as runner:
        yield runner


def _client(agent: AgentRunner, name: str, parker: TorchParker) -> Baton:
    return Baton(
        agent.socket, [GPU], name=name, gpu_memory_mib=60,
        on_park=parker.park, on_restore=parker.restore,
    )  # fmt: skip


def test_another_turn_parks_every_process_of_the_tenant(agent: AgentRunner) -> None:
    ranks = [TorchParker(torch.ones(ELEMENTS)) for _ in range(2)]
    job = [_client(agent, "job", parker) for parker in ranks]
    other = _client(agent, "other", TorchParker(torch.ones(1)))
    try:
        for client in job:  # both ranks connected, the tenant on the GPU
            with client.turn(timeout=10):
                pass
        with other.turn(timeout=10):  # granted once the job's 60 MiB is gone: all of it
            assert [parker.parked for parker in ranks] == [True, True]
            tenant = agent.status()["residency"]["tenants"]["local/job"]
            assert tenant["parked_bytes"] == 2 * ELEMENTS * 4
        with job[1].turn(timeout=10):
            assert [parker.parked for parker in ranks] == [False, False]
    finally:
        for client in (*job, other):
            client.close()


def test_a_process_that_joined_after_the_park_does_not_fail_the_restore(
    agent: AgentRunner,
) -> None:
    first, late = TorchParker(torch.ones(ELEMENTS)), TorchParker(torch.ones(ELEMENTS))
    job = _client(agent, "job", first)
    other = _client(agent, "other", TorchParker(torch.ones(1)))
    joined: list[Baton] = []
    try:
        with job.turn(timeout=10):
            pass
        with other.turn(timeout=10):  # parks the job: its one process then
            assert first.parked
            joined.append(_client(agent, "job", late))
            joined[0].connect()
        with job.turn(timeout=10):  # its restore asks `late` too, which parked nothing
            assert not first.parked and not late.parked
    finally:
        for client in (job, other, *joined):
            client.close()

"""A tenant two of whose processes (or two clients in one process: two `BatonCallback()`s, or the
ranks of a `torchrun` in one pod, all one tenant) park themselves: another tenant's turn that
needs the room parks both, not only the first to connect, and the tenant's next turn brings both
back."""

from __future__ import annotations

import pytest
import torch

from agent.client import Baton
from agent.client.torch import TorchParker
from agent.parking.setup import ParkingOptions
from baton.contract.names import fake_gpu_uuid
from tests.harness.agent import AgentRunner

pytestmark = pytest.mark.timeout(60)


def test_another_turn_parks_every_process_of_a_tenant_that_parks_itself(workdir: str) -> None:
    gpu = fake_gpu_uuid(0)
    parking = ParkingOptions(backend="app", fake_gpus="1x100", simulated_inventory=True)
    with AgentRunner(workdir, parking=parking) as agent:
        first, second = TorchParker(torch.ones(1 << 18)), TorchParker(torch.ones(1 << 18))
        clients = [
            Baton(
                agent.socket,
                [gpu],
                name="job",
                gpu_memory_mib=60,
                on_park=p.park,
                on_restore=p.restore,
            )
            for p in (first, second)
        ]
        other = Baton(
            agent.socket, [gpu], name="other", gpu_memory_mib=60,
            on_park=lambda gpu: 0, on_restore=lambda gpu: 0,
        )  # fmt: skip
        try:
            for client in clients:
                with client.turn(timeout=10):
                    pass
            with other.turn(timeout=10):  # needs the job's 60 MiB gone: all of it
                assert first.parked and second.parked
                job = agent.status()["residency"]["tenants"]["local/job"]
                assert job["parked_bytes"] == 2 * (1 << 18) * 4
            with clients[0].turn(timeout=10):
                assert not first.parked and not second.parked
        finally:
            for client in (*clients, other):
                client.close()

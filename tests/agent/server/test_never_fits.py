"""An ask that can never fit (more memory than its GPU holds) is refused when asked, with the
sentence a timed-out acquire used to carry, and the queue goes on for the others."""

from __future__ import annotations

import asyncio
import time

import pytest

from agent.client import AsyncBaton, Baton, InvalidRequest, Refused
from agent.parking.setup import ParkingOptions
from baton.contract.names import fake_gpu_uuid
from tests.harness.agent import AgentRunner

GPU = fake_gpu_uuid(0)
pytestmark = pytest.mark.timeout(60)


def test_a_tenant_larger_than_its_gpu_is_refused_at_once(workdir: str) -> None:
    parking = ParkingOptions(
        backend="fake", fake_gpus="1x100", fake_dir=f"{workdir}/gpus", headroom_mib=0
    )
    agent = AgentRunner(workdir, parking=parking).start()
    big = Baton(agent.config.socket, [GPU], name="big", gpu_memory_mib=1024)
    small = Baton(agent.config.socket, [GPU], name="small", gpu_memory_mib=10)
    try:
        asked = time.monotonic()
        with pytest.raises(Refused) as refused:
            big.acquire(timeout=30.0)
        assert time.monotonic() - asked < 10.0  # not at the timeout
        assert "needs 1024 MiB on GPU-fake-0000, which holds 100 MiB" in str(refused.value)
        assert "can ever be granted" in str(refused.value)
        small.acquire(timeout=10.0)  # the others' turns go on
        small.yield_()
    finally:
        big.close()
        small.close()
        agent.stop()


@pytest.mark.parametrize("client", ["blocking", "asyncio"])
@pytest.mark.parametrize("asks", [[GPU], [GPU, fake_gpu_uuid(1)]], ids=["one-gpu", "two-gpus"])
def test_a_tenant_larger_than_its_gpu_is_refused_while_another_holds_it(
    workdir: str, client: str, asks: list[str]
) -> None:
    """Not after the holder's turn (nor at the timeout, if that comes first): the ask can never
    be granted, whoever holds the GPU now."""
    parking = ParkingOptions(
        backend="fake", fake_gpus="2x100", fake_dir=f"{workdir}/gpus", headroom_mib=0
    )
    agent = AgentRunner(workdir, parking=parking).start()
    small = Baton(agent.config.socket, [GPU], name="small", gpu_memory_mib=10)
    try:
        small.acquire(timeout=10.0)  # held through the big tenant's ask
        asked = time.monotonic()
        with pytest.raises(Refused) as refused:
            if client == "blocking":
                with Baton(agent.config.socket, asks, name="big", gpu_memory_mib=1024) as big:
                    big.acquire(timeout=12.0)
            else:
                asyncio.run(_acquire_async(agent.config.socket, asks))
        assert time.monotonic() - asked < 10.0  # not at the timeout
        assert "needs 1024 MiB on GPU-fake-0000, which holds 100 MiB" in str(refused.value)
        assert "can ever be granted" in str(refused.value)
        assert small.lease is not None  # the holder's turn goes on
        small.yield_()
    finally:
        small.close()
        agent.stop()


async def _acquire_async(socket: str, gpus: list[str]) -> None:
    async with AsyncBaton(socket, gpus, name="big", gpu_memory_mib=1024) as big:
        await big.acquire(timeout=12.0)


def test_a_tenant_naming_a_gpu_the_node_lacks_is_refused_when_it_registers(workdir: str) -> None:
    parking = ParkingOptions(backend="fake", fake_gpus="2x100", fake_dir=f"{workdir}/gpus")
    agent = AgentRunner(workdir, parking=parking).start()
    lost = Baton(agent.config.socket, [GPU, "GPU-0"], name="lost", gpu_memory_mib=10)
    try:
        with pytest.raises(InvalidRequest) as refused:
            lost.acquire(timeout=10.0)
        said = f"GPU-0: not a GPU of this node (it has {GPU}, {fake_gpu_uuid(1)}); check BATON_GPUS"
        assert str(refused.value).splitlines() == [said], refused.value
        assert "local/lost" not in agent.status()["tenants"]
    finally:
        lost.close()
        agent.stop()

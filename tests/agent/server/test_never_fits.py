"""An ask that can never fit (more memory than its GPU holds) is refused when asked, with the
sentence a timed-out acquire used to carry, and the queue goes on for the others."""

from __future__ import annotations

import time

import pytest

from agent.client import Baton, InvalidRequest, Refused
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

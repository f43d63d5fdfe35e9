"""`baton_tenant_parked_byte_seconds_total` charges each tenant the time its memory was parked,
whenever /metrics or /v1/status is read: not what happens to be parked at a scrape, times the
time since the scrape before."""

from __future__ import annotations

import time

import pytest

from agent.client import Baton
from agent.parking.backends.fakegpu import FakeGpuMemory
from agent.server.accounting import Accounting
from baton.contract.names import MIB, fake_gpu_uuid
from tests.harness.agent import AgentRunner, one_small_fake_gpu

GPU = fake_gpu_uuid(0)
MIB_EACH = 60
WAIT_S = 10.0
pytestmark = pytest.mark.timeout(60)


def test_what_is_parked_between_two_readings_is_charged_from_when_it_was_parked() -> None:
    acct = Accounting()
    acct.parked(0.0, {}, {})  # a scrape
    acct.parked(10.0, {"ml/a": 100}, {})  # a parked
    acct.parked(15.0, {}, {})  # a restored
    acct.parked(60.0, {"ml/b": 100}, {})  # b parked just before the next scrape
    assert acct.parked_byte_seconds == {("ml/a", "ml", 0): 500.0}
    acct.parked(70.0, {"ml/b": 100}, {})
    assert acct.parked_byte_seconds[("ml/b", "ml", 0)] == 1000.0


def _charged(agent: AgentRunner, tenant: str) -> float:
    """The tenant's parked byte-seconds as a scrape of /metrics shows them (0: no series)."""
    status, text = agent.http("/metrics")
    assert status == 200
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        if name == "baton_tenant_parked_byte_seconds_total" and f'tenant="{tenant}"' in rest:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_tenant_parked_and_restored_between_two_scrapes_is_charged_for_that_time(
    workdir: str,
) -> None:
    """a is parked for b's turn and restored for its own between two scrapes: it is charged
    for those moments; b, parked for a's turn, only from then on."""
    parking = one_small_fake_gpu(workdir)
    agent = AgentRunner(workdir, parking=parking).start()
    a = Baton(agent.config.socket, [GPU], name="a", gpu_memory_mib=MIB_EACH)
    b = Baton(agent.config.socket, [GPU], name="b", gpu_memory_mib=MIB_EACH)
    try:
        a.acquire(timeout=WAIT_S)
        FakeGpuMemory("local/a", parking.fake_dir).allocate(GPU, MIB_EACH)
        a.yield_()
        assert _charged(agent, "local/a") == _charged(agent, "local/b") == 0.0
        before_b = time.monotonic()
        b.acquire(timeout=WAIT_S)  # a does not fit beside b: parked
        FakeGpuMemory("local/b", parking.fake_dir).allocate(GPU, MIB_EACH)
        b.yield_()
        before_a = time.monotonic()
        a.acquire(timeout=WAIT_S)  # b parked, a restored
        a_back = time.monotonic()
        a.yield_()
        charged_a, charged_b = _charged(agent, "local/a"), _charged(agent, "local/b")
        scraped = time.monotonic()
        assert 0 < charged_a <= MIB_EACH * MIB * (a_back - before_b)
        assert 0 < charged_b <= MIB_EACH * MIB * (scraped - before_a)
    finally:
        a.close()
        b.close()
        agent.stop()

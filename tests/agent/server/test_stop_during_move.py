"""An agent stopped while a move it cannot cut short outlasts its wait for background work
says so, naming the tenant whose memory is moving, before it says it stopped."""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

import pytest

from agent.client import Baton, BatonError
from agent.parking.backends.fakegpu import FakeGpuMemory
from agent.server import turn_state
from baton.contract.names import fake_gpu_uuid
from tests.harness.agent import AgentRunner, one_small_fake_gpu

GPU = fake_gpu_uuid(0)
WAIT_S = 10.0
pytestmark = pytest.mark.timeout(60)


def test_a_stop_that_leaves_a_park_under_way_names_the_tenant_being_moved(
    workdir: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(turn_state, "CLOSE_WAIT_S", 0.05)
    parking = one_small_fake_gpu(workdir)
    agent = AgentRunner(workdir, parking=parking).start()
    backend = agent.service.preparer.backend  # type: ignore[attr-defined]
    parks, parking_now, let_go = backend.park, threading.Event(), threading.Event()

    def held_park(tenant_id: str, gpu: str) -> Any:
        """The park of a for b's turn runs until the test lets it end."""
        parking_now.set()
        let_go.wait(WAIT_S)
        return parks(tenant_id, gpu)

    a = Baton(agent.config.socket, [GPU], name="a", gpu_memory_mib=60, reconnect=False)
    b = Baton(agent.config.socket, [GPU], name="b", gpu_memory_mib=60, reconnect=False)

    def b_asks() -> None:
        with contextlib.suppress(BatonError):  # the agent stops under it
            b.acquire(timeout=WAIT_S)

    asking = threading.Thread(target=b_asks, daemon=True)
    try:
        a.acquire(timeout=WAIT_S)
        FakeGpuMemory("local/a", parking.fake_dir).allocate(GPU, 60)
        a.yield_()
        backend.park = held_park
        asking.start()
        assert parking_now.wait(WAIT_S)
        caplog.set_level(logging.INFO, logger="agent.assembly")
        agent.stop()  # its wait for the park ends first: the park goes on until let go
        said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("memory of local/a still moving" in line for line in said), said
    finally:
        let_go.set()
        asking.join(WAIT_S)
        a.close()
        b.close()
        agent.stop()

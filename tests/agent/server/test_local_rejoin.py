"""A local tenant whose process exited while its turn was being prepared (the preparation waits
for the parking lock behind a move), and which registers again under the same name before the
agent has forgotten the one that left: the departed tenant's preparation makes no room for it."""

from __future__ import annotations

import logging
import threading

import pytest

from agent.client import Baton, BatonError
from agent.core import events as ev
from agent.parking.backends.base import Residency
from agent.parking.backends.fakegpu import FakeGpuMemory
from baton.contract.names import fake_gpu_uuid
from commands.localnode.procs import wait_for
from tests.harness.agent import AgentRunner, one_small_fake_gpu

GPU = fake_gpu_uuid(0)
A = "local/a"
WAIT_S = 10.0
pytestmark = pytest.mark.timeout(60)


def test_a_turn_prepared_for_a_tenant_that_left_parks_nobody_for_its_namesake(
    workdir: str, caplog: pytest.LogCaptureFixture
) -> None:
    """a (parked) is granted its turn, and its process exits while the restore waits for the
    lock. A new process registers as a at once. The departed a's preparation took the new one for
    itself: it parked b (idle, resident) and restored the departed a's memory for nobody. The new
    registration now waits until the departed a is forgotten (logged): nothing moves."""
    caplog.set_level(logging.INFO, logger="agent.server.tenancy")
    parking = one_small_fake_gpu(workdir)
    fake_dir = parking.fake_dir
    agent = AgentRunner(workdir, parking=parking).start()
    socket = agent.config.socket
    a = Baton(socket, [GPU], name="a", gpu_memory_mib=60)
    b = Baton(socket, [GPU], name="b", gpu_memory_mib=60)
    again: Baton | None = None
    prep = agent.service.preparer
    lock = prep._lock  # type: ignore[attr-defined]
    held = False
    try:
        a.acquire(timeout=WAIT_S)
        FakeGpuMemory(A, fake_dir).allocate(GPU, 60)
        a.yield_()
        b.acquire(timeout=WAIT_S)  # a is parked for b
        FakeGpuMemory("local/b", fake_dir).allocate(GPU, 60)
        b.yield_()
        assert agent.moves("park") == 1
        agent.call(lock.acquire())  # a move of another tenant runs: a's restore waits
        held = True
        failed: list[BaseException] = []

        def take() -> None:
            try:
                a.acquire(timeout=WAIT_S)
            except BatonError as exc:
                failed.append(exc)

        asking = threading.Thread(target=take)
        asking.start()
        agent.wait_queued_on(lock, "a's restore to wait for the lock", WAIT_S)
        mark = agent.mark()
        a.close()  # its process exits: its forget waits for the lock behind the restore
        asking.join(WAIT_S)
        assert not asking.is_alive() and failed, "a's acquire outlived its client"
        agent.wait_event(lambda e: e.kind == ev.TENANT_GONE and e.tenant_id == A, since=mark)
        again = Baton(socket, [GPU], name="a", gpu_memory_mib=60)
        joining = threading.Thread(target=again.connect)  # waits for the forget, if it must
        joining.start()

        def arrived() -> bool | None:  # registered at once, or waiting for the forget
            waits = any("its departed namesake" in r.getMessage() for r in caplog.records)
            return waits or bool(agent.inspect(lambda s: A in s.tenants.tenants)) or None

        wait_for("the new a's registration to reach the agent", arrived, WAIT_S, every=0.01)
        agent.inspect(lambda s: lock.release())
        held = False
        joining.join(WAIT_S)
        assert not joining.is_alive(), "the new a never registered"
        assert agent.inspect(lambda s: A in s.tenants.tenants)
        agent.call(prep.settled())  # type: ignore[attr-defined]
        assert prep.backend.state("local/b").residency == {GPU: Residency.RESIDENT}  # type: ignore[attr-defined]
        assert agent.moves("park") == 1, "b was parked for the departed a's turn"
        assert agent.moves("restore") == 0, "the departed a's memory was restored for nobody"
    finally:
        if held:
            agent.inspect(lambda s: lock.release())
        a.close()
        b.close()
        if again is not None:
            again.close()
        agent.stop()

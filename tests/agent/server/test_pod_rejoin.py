"""A pod that leaves the node while its turn is being prepared (the preparation waits for the
parking lock behind a move), recreated under the same name (a StatefulSet's pod) before the agent
has forgotten the one that left: the departed pod's preparation makes no room for it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent.core import events as ev
from agent.node.tenants import POD, Tenant
from agent.parking.backends.base import Residency
from agent.parking.backends.fakegpu import FakeGpuMemory
from baton.contract.names import fake_gpu_uuid
from tests.harness.agent import AgentRunner, one_small_fake_gpu

GPU = fake_gpu_uuid(0)
WAIT_S = 10.0
pytestmark = pytest.mark.timeout(60)


def pod(name: str, uid: str) -> Tenant:
    return Tenant(f"default/{name}", name, (GPU,), gpu_memory_mib=60, source=POD, pod_uid=uid)


def turn(agent: AgentRunner, tenant: Tenant, fake_dir: str) -> None:
    """The pod takes a turn, allocates its 60 MiB in it and yields."""
    granted = agent.call(agent.service.acquire(tenant, [GPU], WAIT_S))
    FakeGpuMemory(tenant.tenant_id, fake_dir).allocate(GPU, 60)
    agent.inspect(lambda s: s.yield_(tenant, granted.lease.lease_id))


def test_a_turn_prepared_for_a_pod_that_left_parks_nobody_for_its_namesake(workdir: str) -> None:
    """Pod a (parked) is granted its turn and leaves the node while the restore waits for the
    lock; a pod of the same name appears at once. The departed a's preparation took the new one
    for itself: it parked b (idle, resident) and restored the departed a's memory for nobody."""
    parking = one_small_fake_gpu(workdir)
    fake_dir = parking.fake_dir
    agent = AgentRunner(workdir, parking=parking).start()
    a, b = pod("a", "uid-a1"), pod("b", "uid-b")
    prep = agent.service.preparer
    lock = prep._lock  # type: ignore[attr-defined]
    held = False
    try:
        agent.inspect(lambda s: s.upsert_pod(a))
        agent.inspect(lambda s: s.upsert_pod(b))
        turn(agent, a, fake_dir)
        turn(agent, b, fake_dir)  # a is parked for b
        assert agent.moves("park") == 1
        agent.call(lock.acquire())  # a move of another tenant runs: a's restore waits
        held = True
        asking: Any = agent.inspect(lambda s: asyncio.ensure_future(s.acquire(a, [GPU], WAIT_S)))
        agent.wait_queued_on(lock, "a's restore to wait for the lock", WAIT_S)
        mark = agent.mark()
        agent.inspect(lambda s: s.pod_gone(a.tenant_id))  # its forget waits behind the restore
        agent.wait_event(
            lambda e: e.kind == ev.TENANT_GONE and e.tenant_id == a.tenant_id, since=mark
        )
        assert agent.inspect(lambda s: asking.done() and asking.exception() is not None)
        agent.inspect(lambda s: s.upsert_pod(pod("a", "uid-a2")))  # the StatefulSet's new pod
        agent.inspect(lambda s: lock.release())
        held = False
        agent.call(prep.settled())  # type: ignore[attr-defined]
        agent.call(agent.service.forgotten(a.tenant_id))
        assert prep.backend.state(b.tenant_id).residency == {GPU: Residency.RESIDENT}  # type: ignore[attr-defined]
        assert agent.moves("park") == 1, "b was parked for the departed a's turn"
        assert agent.moves("restore") == 0, "the departed a's memory was restored for nobody"
        assert agent.inspect(lambda s: s.tenants.tenants[a.tenant_id].pod_uid) == "uid-a2"
    finally:
        if held:
            agent.inspect(lambda s: lock.release())
        agent.stop()

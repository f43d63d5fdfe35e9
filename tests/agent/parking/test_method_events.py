"""The event stream names each tenant's parking method: its joining, queueing and grant."""

from __future__ import annotations

import asyncio
import time

from agent.core import events as ev
from agent.core.leases import LeaseTable
from agent.core.residency import NullPreparer
from agent.node.tenants import POD, Tenant
from agent.parking.preparer import ParkingPreparer
from agent.server.service import LeaseService

from .test_methods import GPU, node

GIB = 1 << 30


def service(parks: bool) -> LeaseService:
    """A lease service over cuda, app and fake (cuda the default), or one that parks nobody."""
    backend = node([])
    return LeaseService(
        table=LeaseTable(clock=time.time),
        preparer=lambda host: (
            ParkingPreparer(backend, {GPU: 10 * GIB}, host_budget=20 * GIB, host=host)
            if parks
            else NullPreparer()
        ),
        clock=time.time,
    )


def pod(name: str, parking: str = "") -> Tenant:
    return Tenant(f"default/{name}", name, (GPU,), source=POD, parking=parking)


async def watch(parks: bool) -> list[tuple[str, str, str]]:
    agent = service(parks)
    events = agent.events.attach()
    agent.upsert_pod(pod("plain"))
    agent.upsert_pod(pod("asks", parking="fake"))
    granted = await agent.acquire(pod("plain"), [GPU], timeout=5)
    agent.yield_(pod("plain"), granted.lease.lease_id)
    seen = []
    while not events.empty():
        e = events.get_nowait()
        seen.append((e.kind, e.tenant_id, e.detail))
    await agent.close()
    return seen


def test_joining_queueing_and_grants_name_the_method_that_parks_the_tenant():
    seen = asyncio.run(asyncio.wait_for(watch(parks=True), 10))
    named = [s for s in seen if s[0] in (ev.TENANT_JOINED, ev.QUEUED, ev.GRANTED)]
    assert named == [
        (ev.TENANT_JOINED, "default/plain", "pod; parking cuda"),
        (ev.TENANT_JOINED, "default/asks", "pod; parking fake"),
        (ev.QUEUED, "default/plain", "parking cuda"),
        (ev.GRANTED, "default/plain", "parking cuda"),
    ]
    others = [d for k, _, d in seen if k not in (ev.TENANT_JOINED, ev.QUEUED, ev.GRANTED)]
    assert others and not any("parking" in d for d in others)  # its yield keeps its own detail


def test_a_node_that_parks_nobody_names_no_method():
    seen = asyncio.run(asyncio.wait_for(watch(parks=False), 10))
    assert [d for k, _, d in seen if k in (ev.TENANT_JOINED, ev.QUEUED, ev.GRANTED)] == [
        "pod",
        "pod",
        "",
        "",
    ]

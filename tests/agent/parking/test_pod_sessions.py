"""A pod that parked itself (`app`) and whose last session ended has nothing left to park: its
memory lived in its process. It stops counting until a process of it opens a session again."""

from __future__ import annotations

import asyncio
import time

from agent.core.leases import LeaseTable
from agent.node.tenants import POD, Tenant
from agent.parking.preparer import ParkingPreparer
from agent.server.service import LeaseService
from agent.server.sessions import Session

from .test_methods import GPU, node

GIB = 1 << 30


def pod(name: str, parking: str = "") -> Tenant:
    """A pod tenant declaring 6 GiB of a 10 GiB GPU: two cannot be resident at once."""
    return Tenant(f"default/{name}", name, (GPU,), 6144, source=POD, parking=parking)


async def scenario(parking: str) -> tuple[list[tuple[str, str, str]], list[bool]]:
    calls: list[tuple[str, str, str]] = []
    backend = node(calls)  # cuda (the node's default), app, fake
    agent = LeaseService(
        table=LeaseTable(clock=time.time),
        preparer=lambda host: ParkingPreparer(
            backend, {GPU: 10 * GIB}, host_budget=20 * GIB, host=host
        ),
        clock=time.time,
    )
    done, following = pod("done", parking), pod("next")
    agent.upsert_pod(done)
    agent.upsert_pod(following)
    session = Session(done.tenant_id, 41, "token", frozenset({"park", "restore"}))
    agent.sessions.open(session)
    agent.session_opened(done.tenant_id, 41)
    turn = await agent.acquire(done, [GPU], timeout=5)
    agent.yield_(done, turn.lease.lease_id)
    counted = [done.tenant_id in agent.tenant_refs()]
    agent.session_closed(done.tenant_id, 41, agent.sessions.close(session))
    counted.append(done.tenant_id in agent.tenant_refs())
    turn = await agent.acquire(following, [GPU], timeout=5)
    agent.yield_(following, turn.lease.lease_id)
    again = Session(done.tenant_id, 42, "token", frozenset({"park", "restore"}))
    agent.sessions.open(again)
    agent.session_opened(done.tenant_id, 42)
    counted.append(done.tenant_id in agent.tenant_refs())
    await agent.close()
    return calls, counted


def test_a_self_parking_pod_whose_last_session_ended_is_not_parked_and_counts_again_on_return():
    calls, counted = asyncio.run(asyncio.wait_for(scenario(parking=""), 10))
    assert counted == [True, False, True]
    assert [c for c in calls if c[2] == "default/done"] == []


def test_a_pod_parked_by_the_node_still_counts_after_its_session_ended():
    """The fake or cuda method reads the GPU's truth itself: that pod is parked as before."""
    calls, counted = asyncio.run(asyncio.wait_for(scenario(parking="fake"), 10))
    assert counted == [True, True, True]
    assert ("fake", "park", "default/done") in calls

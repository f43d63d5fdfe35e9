"""A revoked lease's resume: a yield naming the revoked lease ends the turn that gave it back."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from agent.core.leases import LeaseTable
from agent.core.residency import NullPreparer
from agent.node.state import StateStore
from agent.node.tenants import POD, Tenant
from agent.server.service import LeaseService


def test_a_yield_of_a_lease_revoked_twice_ends_the_turn_that_gave_it_back_last(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        table = LeaseTable(clock=time.time, max_hold=0.2)
        service = LeaseService(
            table=table,
            preparer=lambda host: NullPreparer(),
            clock=time.time,
            store=StateStore(tmp_path),
        )
        service.load()
        a, b = (Tenant(f"team/{n}", n, ("GPU-0",), source=POD) for n in ("a", "b"))
        service.upsert_pod(a)
        service.upsert_pod(b)
        held = [(await service.acquire(a, (), timeout=5)).lease.lease_id]
        for _ in range(2):  # a's turn runs out while b waits, twice
            table.max_hold = 60.0  # b's turn does not
            theirs = await service.acquire(b, (), timeout=5)
            table.max_hold = 0.2
            service.yield_(b, theirs.lease.lease_id)  # a's turn is given back
            held += [lease.lease_id for lease in table.leases_of("team/a")]
        assert len(set(held)) == 3  # revoked, given back, revoked, given back
        service.yield_(a, held[0])
        assert not table.leases
        await service.close()

    asyncio.run(asyncio.wait_for(body(), 10))

"""A revoked lease's resume: a yield naming the revoked lease ends the turn that gave it back."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from agent.core.errors import AgentError
from agent.core.leases import LeaseTable
from agent.core.residency import NullPreparer
from agent.node.state import STATE_FILE, StateStore
from agent.node.tenants import POD, Tenant
from agent.server import turn_state
from agent.server.service import LeaseService


def started(tmp_path: Path, table: LeaseTable) -> tuple[LeaseService, Tenant, Tenant]:
    """A service of `table` keeping its state in `tmp_path` (loaded), and its pods team/a and
    team/b, both on GPU-0."""
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
    return service, a, b


def test_a_yield_of_a_lease_revoked_twice_ends_the_turn_that_gave_it_back_last(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        table = LeaseTable(clock=time.time, max_hold=0.2)
        service, a, b = started(tmp_path, table)
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


def test_the_journal_holds_a_resume_from_its_revocation_until_it_is_granted_or_given_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What an agent killed at each step (no snapshot since) comes back with."""
    monkeypatch.setattr(turn_state, "SAVE_DELAY_S", 60.0)

    def found() -> tuple[list[str], list[str]]:
        saved = StateStore(tmp_path).load()
        return [x.tenant_id for x in saved.leases], [r.tenant_id for r in saved.resumes.values()]

    async def body() -> None:
        table = LeaseTable(clock=time.time, max_hold=0.2)
        service, a, b = started(tmp_path, table)
        await service.acquire(a, (), timeout=5)
        table.max_hold = 60.0
        theirs = await service.acquire(b, (), timeout=5)  # once a's turn is revoked
        assert found() == (["team/b"], ["team/a"])  # the revocation's write holds the resume
        service.yield_(a, "")  # a gives up the turn it was to get back
        assert found() == (["team/b"], [])
        service.yield_(b, theirs.lease.lease_id)
        table.max_hold = 0.2
        await service.acquire(a, (), timeout=5)
        table.max_hold = 60.0
        theirs = await service.acquire(b, (), timeout=5)  # a's turn is revoked again
        service.yield_(b, theirs.lease.lease_id)  # and given back
        assert found() == (["team/a"], [])
        await service.close()

    asyncio.run(asyncio.wait_for(body(), 10))


def test_an_acquire_naming_a_revoked_lease_takes_the_turn_that_gives_it_back(
    tmp_path: Path,
) -> None:
    """Queued (it waits for it), granted already (the push crossed the acquire), or given up (it
    queues anew); a tenant with no session (an llm-d job) joins its resume without naming it."""

    async def body() -> None:
        table = LeaseTable(clock=time.time, max_hold=0.2)
        service, a, b = started(tmp_path, table)
        first = (await service.acquire(a, (), timeout=5)).lease.lease_id
        table.max_hold = 60.0
        theirs = await service.acquire(b, (), timeout=5)  # once a's turn is revoked
        [resume] = table.waiters
        mine = asyncio.create_task(service.acquire(a, (), timeout=5, revoked=first))
        await asyncio.sleep(0)  # it waits for the resume (no new waiter, no error)
        assert list(table.waiters) == [resume] and not mine.done()
        service.yield_(b, theirs.lease.lease_id)
        assert (await mine).lease.lease_id == resume  # the grant answered the acquire
        again = await service.acquire(a, (), timeout=5, revoked=first)  # after the grant
        assert again.lease.lease_id == resume
        service.yield_(a, resume)
        table.max_hold = 0.2
        late = await service.acquire(a, (), timeout=5, revoked=first)  # given up: a new turn
        assert late.lease.lease_id != resume
        table.max_hold = 60.0
        theirs = await service.acquire(b, (), timeout=5)  # once a's turn is revoked again
        alone = asyncio.create_task(service.acquire(a, (), timeout=5))  # no session: joins
        await asyncio.sleep(0)
        assert not alone.done() and all(w.front for w in table.waiters.values())
        service.yield_(b, theirs.lease.lease_id)
        [held] = table.leases_of("team/a")
        assert (await alone).lease == held
        await service.close()

    asyncio.run(asyncio.wait_for(body(), 10))


def test_an_acquire_waiting_for_a_resume_the_tenant_gives_up_hears_so(tmp_path: Path) -> None:
    async def body() -> None:
        table = LeaseTable(clock=time.time, max_hold=0.2)
        service, a, b = started(tmp_path, table)
        first = (await service.acquire(a, (), timeout=5)).lease.lease_id
        table.max_hold = 60.0
        await service.acquire(b, (), timeout=5)  # once a's turn is revoked
        mine = asyncio.create_task(service.acquire(a, (), timeout=5, revoked=first))
        await asyncio.sleep(0)
        service.yield_(a, "")  # another thread of a's gives the turn up
        with pytest.raises(AgentError, match="was given up before it came back"):
            await mine
        assert not table.waiters
        await service.close()

    asyncio.run(asyncio.wait_for(body(), 10))


def test_the_snapshot_is_in_a_format_the_agent_before_refuses_only_while_it_keeps_a_resume(
    tmp_path: Path,
) -> None:
    """Rolled back one version, an agent takes back a state it loses nothing of (format 1) and
    refuses, naming the format, one keeping a revoked tenant's place, which it would drop."""

    def written_format() -> int:
        return int(json.loads((tmp_path / STATE_FILE).read_text())["format"])

    async def body() -> None:
        table = LeaseTable(clock=time.time, max_hold=0.2)
        service, a, b = started(tmp_path, table)
        await service.acquire(a, (), timeout=5)
        table.max_hold = 60.0
        await service.acquire(b, (), timeout=5)  # a's turn is revoked, kept to give back
        await service.close()
        assert written_format() == 2
        service, a, b = started(tmp_path, LeaseTable(clock=time.time, max_hold=60.0))
        service.yield_(a, "")  # a gives up the turn it was to get back
        await service.close()
        assert written_format() == 1

    asyncio.run(asyncio.wait_for(body(), 10))

"""A grant leaves in the event-loop step that freed the GPU: no task, no later step between."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from agent.core import events as ev
from agent.core.errors import AlreadyHolding
from agent.core.leases import Lease, LeaseTable
from agent.core.residency import NullPreparer
from agent.node import state
from agent.node.state import JOURNAL_FILE, StateStore
from agent.node.tenants import POD, Tenant
from agent.server.service import LeaseService
from agent.server.session_stream import SessionStream
from baton._pb import agent_pb2 as pb

GPU = "GPU-0"


def tenant(name: str) -> Tenant:
    return Tenant(f"default/{name}", name, (GPU, "GPU-1"), source=POD)


def service(store: StateStore | None = None) -> LeaseService:
    agent = LeaseService(
        table=LeaseTable(clock=time.time),
        preparer=lambda host: NullPreparer(),
        clock=time.time,
        store=store,
    )
    for name in ("a", "b"):
        agent.upsert_pod(tenant(name))
    return agent


class Link:
    """A direct session's link as the stream sees it; what it wrote, and how."""

    def __init__(self) -> None:
        self.incoming: asyncio.Queue[pb.ClientMessage | None] = asyncio.Queue()
        self.later: list[pb.AgentMessage] = []
        self.now: list[pb.AgentMessage] = []

    async def read(self) -> pb.ClientMessage | None:
        return await self.incoming.get()

    async def write(self, message: pb.AgentMessage) -> None:
        self.later.append(message)

    def write_now(self, message: pb.AgentMessage) -> bool:
        self.now.append(message)
        return True


def test_the_waiting_tenants_grant_is_told_while_the_yield_is_handled() -> None:
    async def handoff() -> None:
        agent = service()
        held = await agent.acquire(tenant("a"), [GPU], timeout=5)
        told: list[Lease] = []
        waiting = asyncio.create_task(agent.acquire(tenant("b"), [GPU], 5, told.append))
        await asyncio.sleep(0)  # b is queued
        agent.yield_(tenant("a"), held.lease.lease_id)
        assert [lease.tenant_id for lease in told] == ["default/b"]  # before any later step
        assert (await waiting).lease is told[0]
        await agent.close()

    asyncio.run(asyncio.wait_for(handoff(), 10))


def test_a_direct_session_writes_the_grant_in_that_step_and_only_once() -> None:
    async def handoff() -> None:
        agent = service()
        held = await agent.acquire(tenant("a"), [GPU], timeout=5)
        link = Link()
        stream = SessionStream(agent, None, link, lambda: tenant("b"))
        serving = asyncio.create_task(stream.serve(pb.AgentMessage()))
        acquire = pb.Request(request_id=7, acquire=pb.AcquireRequest())
        link.incoming.put_nowait(pb.ClientMessage(request=acquire))
        while not agent.table.waiters:  # bounded by the wait_for below
            await asyncio.sleep(0)
        agent.yield_(tenant("a"), held.lease.lease_id)
        assert [m.reply.request_id for m in link.now] == [7]
        assert link.now[0].reply.lease.fencing_tokens[GPU] == 2
        link.incoming.put_nowait(None)
        await serving
        assert [m for m in link.later if m.HasField("reply")] == []  # not written twice
        await agent.close()

    asyncio.run(asyncio.wait_for(handoff(), 10))


def test_the_end_and_the_grant_are_one_journal_write_made_before_the_grant_is_told(
    tmp_path, monkeypatch
) -> None:
    """The journal holds the handoff whole (a's end, then b's grant) from one write that went
    out before b heard; the events and metrics of both follow the tell, in order."""
    writes: list[bytes] = []
    real_write = state.os.write

    def write(fd: int, data: bytes) -> int:
        if bytes(data[:7]) in (b'{"end":', b'{"grant'):  # the journal's (the snapshot's thread
            writes.append(bytes(data))  # writes too)
        return real_write(fd, data)

    async def handoff() -> None:
        agent = service(StateStore(tmp_path))
        events = agent.events.attach()
        held = await agent.acquire(tenant("a"), [GPU], timeout=5)
        seen_at_tell: list[tuple[int, int]] = []

        def told(lease: Lease) -> None:  # what was on disk and on the bus when b heard
            seen_at_tell.append((len(writes), events.qsize()))

        waiting = asyncio.create_task(agent.acquire(tenant("b"), [GPU], 5, told))
        await asyncio.sleep(0)  # b is queued
        while not events.empty():
            events.get_nowait()
        writes.clear()
        monkeypatch.setattr(state.os, "write", write)
        agent.yield_(tenant("a"), held.lease.lease_id)
        monkeypatch.setattr(state.os, "write", real_write)
        assert seen_at_tell == [(1, 0)]  # one write before the tell, no event yet
        assert [line.split(b'"')[1] for line in writes[0].splitlines()] == [b"end", b"grant"]
        *_, end, grant = (json.loads(x) for x in (tmp_path / JOURNAL_FILE).read_text().splitlines())
        assert end["end"] == held.lease.lease_id and grant["grant"]["tenant_id"] == "default/b"
        kinds = [events.get_nowait().kind for _ in range(events.qsize())]
        assert kinds == [ev.YIELDED, ev.GRANTED]
        await waiting
        await agent.close()

    asyncio.run(asyncio.wait_for(handoff(), 10))


def test_an_end_no_grant_follows_is_on_disk_when_the_yield_returns(tmp_path) -> None:
    async def alone() -> None:
        agent = service(StateStore(tmp_path))
        held = await agent.acquire(tenant("a"), [GPU], timeout=5)
        agent.yield_(tenant("a"), held.lease.lease_id)
        last = json.loads((tmp_path / JOURNAL_FILE).read_text().splitlines()[-1])
        assert last["end"] == held.lease.lease_id
        await agent.close()

    asyncio.run(asyncio.wait_for(alone(), 10))


def test_a_grant_whose_answer_died_with_the_agent_is_the_answer_to_the_next_acquire(
    tmp_path,
) -> None:
    """The agent granted b's acquire and was killed before b read the answer; b's client, back
    on the next agent, asks again. It gets that turn, same lease and fencing token, not 'already
    holds'. A lease a client has named since the restart (its reclaim) is not handed out so."""

    async def restart() -> None:
        before = service(StateStore(tmp_path))
        held = await before.acquire(tenant("b"), [GPU], timeout=5)  # its answer is lost
        claimed = await before.acquire(tenant("a"), ["GPU-1"], timeout=5)
        await before.close()
        after = service(StateStore(tmp_path))
        after.load()
        again = await after.acquire(tenant("b"), [GPU], timeout=5)
        assert again.lease.lease_id == held.lease.lease_id
        assert again.lease.tokens == held.lease.tokens == {GPU: 1}
        assert after.inspect(tenant("a"), claimed.lease.lease_id)  # a's client reclaims it
        with pytest.raises(AlreadyHolding):
            await after.acquire(tenant("a"), ["GPU-1"], timeout=5)
        with pytest.raises(AlreadyHolding):  # b's now holds it, knowingly
            await after.acquire(tenant("b"), [GPU], timeout=5)
        await after.close()

    asyncio.run(asyncio.wait_for(restart(), 10))


@pytest.mark.parametrize("how", ["registered", "pod"])
def test_a_turn_of_a_tenant_newer_than_the_snapshot_survives_a_crash_before_the_next_one(
    tmp_path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """The agent is killed after a new tenant's grant and before any snapshot names the tenant:
    the restarted agent finds the tenant and its turn in the journal (before, the turn was
    dropped with the tenant the snapshot lacked, and the GPU went to the next waiter while the
    holder still computed)."""
    monkeypatch.setattr(StateStore, "save_soon", lambda self, state: None)  # no snapshot lands

    async def crash() -> Lease:
        agent = LeaseService(
            table=LeaseTable(clock=time.time),
            preparer=lambda host: NullPreparer(),
            clock=time.time,
            store=StateStore(tmp_path),
        )
        if how == "registered":
            holder = await agent.register(4242, 0, pb.RegisterRequest(name="holder", gpus=[GPU]))
        else:
            holder = tenant("holder")
            agent.upsert_pod(holder)
        granted = await agent.acquire(holder, [GPU], timeout=5)
        return granted.lease  # killed here: nothing is closed, flushed or saved

    lease = asyncio.run(asyncio.wait_for(crash(), 10))
    restarted = StateStore(tmp_path).load()
    assert [x.lease_id for x in restarted.leases] == [lease.lease_id]
    assert lease.tenant_id in {t.tenant_id for t in restarted.tenants}
    assert restarted.tokens == {GPU: lease.tokens[GPU]}


def test_a_grant_cancelled_by_the_agents_shutdown_stays_for_the_next_agent(tmp_path: Path) -> None:
    """The shutdown cancels the acquire whose grant a direct session already wrote to its
    tenant: the turn is kept (in the state the next agent loads), not ended as given up."""

    async def shutdown() -> None:
        agent = service(StateStore(tmp_path))
        held = await agent.acquire(tenant("a"), [GPU], timeout=5)
        told: list[Lease] = []
        waiting: asyncio.Task[object] | None = None

        def tell(lease: Lease) -> None:  # the grant reaches b; then the agent stops
            told.append(lease)
            agent.stopping = True
            assert waiting is not None
            waiting.cancel()

        waiting = asyncio.create_task(agent.acquire(tenant("b"), [GPU], 5, tell))
        await asyncio.sleep(0)  # b is queued
        agent.yield_(tenant("a"), held.lease.lease_id)
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert [lease.tenant_id for lease in agent.table.leases.values()] == ["default/b"]
        await agent.close()
        again = service(StateStore(tmp_path))
        again.load()
        assert told[0].lease_id in again.table.leases
        await again.close()

    asyncio.run(asyncio.wait_for(shutdown(), 10))

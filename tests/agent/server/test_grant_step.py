"""A grant leaves in the event-loop step that freed the GPU: no task, no later step between."""

from __future__ import annotations

import asyncio
import time

from agent.core.leases import Lease, LeaseTable
from agent.core.residency import NullPreparer
from agent.node.tenants import POD, Tenant
from agent.server.service import LeaseService
from agent.server.session_stream import SessionStream
from baton._pb import agent_pb2 as pb

GPU = "GPU-0"


def tenant(name: str) -> Tenant:
    return Tenant(f"default/{name}", name, (GPU,), source=POD)


def service() -> LeaseService:
    agent = LeaseService(
        table=LeaseTable(clock=time.time), preparer=lambda host: NullPreparer(), clock=time.time
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

"""The tenants the preparer reads at every grant: one dict while nothing changes, a new one, as
freshly drawn, after every kind of change (joins, processes, sessions, pods that leave)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from agent.core.leases import LeaseTable
from agent.node.tenants import POD, Tenant
from agent.parking.preparer import ParkingPreparer
from agent.server.service import LeaseService
from agent.server.sessions import Session
from baton._pb import agent_pb2 as pb
from tests.agent.parking.test_methods import GPU, node

GIB = 1 << 30


def pod(name: str, parking: str = "") -> Tenant:
    return Tenant(f"default/{name}", name, (GPU,), source=POD, parking=parking)


def test_the_tenants_are_drawn_again_after_each_change_and_only_then() -> None:
    async def scenario() -> None:
        agent = LeaseService(
            table=LeaseTable(clock=time.time),
            preparer=lambda host: ParkingPreparer(
                node([]), {GPU: 10 * GIB}, host_budget=20 * GIB, host=host
            ),
            clock=time.time,
        )
        tenancy = agent.tenancy
        seen = [tenancy.tenant_refs()]

        def after(change: Callable[[], object], why: str) -> None:
            change()
            refs = tenancy.tenant_refs()
            assert refs == tenancy._draw_refs(), f"stale after {why}"
            assert refs is not seen[-1], f"the same dict after {why}"
            assert tenancy.tenant_refs() is refs, f"drawn twice after {why}"
            seen.append(refs)

        after(lambda: agent.upsert_pod(pod("offloads", parking="app")), "a pod joined")
        request = pb.RegisterRequest(name="local", gpus=[GPU])
        local = await agent.register(101, 0, request)
        seen.append(tenancy.tenant_refs())
        after(lambda: agent.tenancy.register(102, 0, request), "a second process registered")
        assert seen[-1][local.tenant_id].pids == (101, 102)
        session = Session("default/offloads", 7, "token", frozenset({"park", "restore"}))
        after(lambda: agent.sessions.open(session), "a session with callbacks opened")
        assert seen[-1]["default/offloads"].self_parks
        after(lambda: agent.state.tenants.add_pids(pod_of(agent), [7]), "a pid from llm-d")
        assert seen[-1]["default/offloads"].pids == (7,)

        def close() -> None:
            agent.session_closed("default/offloads", 7, agent.sessions.close(session))

        after(close, "its last session closed")  # an app pod with no process: not counted
        assert "default/offloads" not in seen[-1]
        after(lambda: agent.state.tenants.drop_pid(local.tenant_id, 101), "a process ended")
        assert seen[-1][local.tenant_id].pids == (102,)
        after(lambda: agent.pod_gone("default/offloads"), "the pod left")
        await agent.close()

    asyncio.run(asyncio.wait_for(scenario(), 10))


def pod_of(agent: LeaseService) -> Tenant:
    return agent.state.tenants.tenants["default/offloads"]

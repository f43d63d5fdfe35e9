"""What the agent's metrics and /v1/status say against what happened on a fake node, over the
real socket."""

from __future__ import annotations

import asyncio
import logging

import pytest

from agent.core import events as ev
from commands.demo.fakenode import FakeNodeOptions

from .nodeharness import LogWatch, TenantProc, run, with_node
from .test_fake_node import metric, status

pytestmark = pytest.mark.timeout(90)


async def revoke_failures(events: asyncio.Queue[ev.Event], tenant_id: str, count: int) -> None:
    """Return once the agent has said `count` times that it could not park `tenant_id`."""
    while count:
        e = await events.get()
        count -= e.kind == ev.REVOKE_FAILED and e.tenant_id == tenant_id


def test_a_holder_that_could_not_be_parked_is_not_counted_as_preempted():
    async def body(node, tenants):
        node.agent.service.revocations.retry_s = 0.05
        env = node.tenant_env()
        async with node.agent.service.events.subscribe() as events:
            a = await TenantProc.start(env, "a", 60, "--turns", "1", "--hold")
            tenants.append(a)
            await a.until("holding")
            b = await TenantProc.start(env, "b", 60, "--turns", "1", "--timeout", "20")
            tenants.append(b)
            # a's 60 MiB do not fit the 50 MiB budget: it keeps the GPU, tried again and again
            await asyncio.wait_for(revoke_failures(events, "local/a", 2), 20)
        assert metric(node, "baton_preemptions_total") == 0
        a.tell()
        await b.until("done")
        assert metric(node, "baton_preemptions_total") == 0

    options = FakeNodeOptions(fake_gpus="1x100", max_hold=0.3, host_memory_budget_mib=50)
    run(with_node(options, body))


def test_a_turn_that_waits_for_room_is_one_refusal_however_often_it_is_tried():
    async def body(node, tenants):
        watch = LogWatch("waits:")
        logging.getLogger("agent.parking").addHandler(watch)
        env = node.tenant_env()
        try:
            a = await TenantProc.start(env, "a", 60, "--turns", "1", "--linger")
            tenants.append(a)
            await a.until("done")
            b = await TenantProc.start(env, "b", 60, "--turns", "1", "--timeout", "30")
            tenants.append(b)
            assert await asyncio.to_thread(watch.seen.wait, 20)  # a cannot be parked for b
            # Turns on the other GPU change the node: b's turn is tried again after each.
            c = await TenantProc.start(node.tenant_env(1), "c", 10, "--turns", "10")
            tenants.append(c)
            await c.until("done")
            assert metric(node, "baton_refused_parks_total", reason="host_budget") == 1
            a.tell()  # a leaves: b fits
            await b.until("done")
        finally:
            logging.getLogger("agent.parking").removeHandler(watch)
        assert metric(node, "baton_refused_parks_total", reason="host_budget") == 1

    run(with_node(FakeNodeOptions(fake_gpus="2x100", host_memory_budget_mib=50), body))


def test_memory_parked_before_an_agent_restart_shows_at_once_after_it():
    async def body(node, tenants):
        env = node.tenant_env()
        for name in ("a", "b"):  # b's turn parks a: 60 + 60 MiB do not fit 100
            tenants.append(await TenantProc.start(env, name, 60, "--turns", "1", "--linger"))
            await tenants[-1].until("done")
        parked = node.agent.service.preparer.status()["parked_bytes"]
        assert parked == 60 * 1024 * 1024
        await node.agent.stop()  # the tenants and their memory stay
        node.preparer.backend.close()
        await node.start()
        residency = await status(node)
        assert residency["parked_bytes"] == parked
        assert residency["tenants"]["local/a"]["parked_bytes"] == parked
        assert metric(node, "baton_parked_bytes") == parked

    run(with_node(FakeNodeOptions(fake_gpus="1x100"), body))

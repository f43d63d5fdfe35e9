"""Tenant processes on an in-process agent with the fake backend, over the real socket."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest

from agent.core import events as ev
from commands.demo.fakenode import FakeNode, FakeNodeOptions

from .nodeharness import APP_TENANT, LogWatch, TenantProc, run, with_node

pytestmark = pytest.mark.timeout(90)


async def status(node: FakeNode) -> dict:
    async with httpx.AsyncClient() as client:
        r = await client.get(f"http://127.0.0.1:{node.agent.http_port}/v1/status", timeout=5)
        return r.json()["residency"]


def metric(node: FakeNode, name: str, **labels) -> float:
    return node.agent.service.metrics.registry.get_sample_value(name, labels) or 0.0


def test_tenants_that_do_not_fit_together_take_turns_and_keep_their_data():
    async def body(node, tenants):
        env = node.tenant_env()
        for name in ("a", "b", "c"):
            tenants.append(
                await TenantProc.start(env, name, 60, "--turns", "4", "--pause-after", "0")
            )
        for t in tenants:
            await t.until("turn")
        for t in tenants:
            t.tell()
        for t in tenants:
            await t.until("done", 60)
            assert [e["i"] for e in t.events if e["event"] == "turn"] == [0, 1, 2, 3]
        for t in tenants:
            assert await t.exit_code() == 0
        assert metric(node, "baton_moves_total", backend="fake", direction="park") >= 3
        assert metric(node, "baton_moves_total", backend="fake", direction="restore") >= 2

    run(with_node(FakeNodeOptions(fake_gpus="1x100"), body))


def test_a_preempted_holder_is_parked_and_resumes_without_noticing():
    async def body(node, tenants):
        env = node.tenant_env()
        a = await TenantProc.start(env, "a", 60, "--turns", "2", "--hold")
        tenants.append(a)
        await a.until("holding")
        b = await TenantProc.start(env, "b", 60, "--turns", "1")
        tenants.append(b)
        await b.until("done", 10)
        # b's turn came while a still held its (revoked) turn: a was parked for it.
        assert metric(node, "baton_preemptions_total") == 1
        assert metric(node, "baton_moves_total", backend="fake", direction="park") >= 1
        a.tell()
        await a.until("done")
        assert await a.exit_code() == 0 and await b.exit_code() == 0
        assert metric(node, "baton_moves_total", backend="fake", direction="restore") >= 1

    run(with_node(FakeNodeOptions(fake_gpus="1x100", max_hold=0.3), body))


async def refused(node, tenants, first_flags, needle):
    watch = LogWatch("waits:")
    logging.getLogger("agent.parking").addHandler(watch)
    try:
        env = node.tenant_env()
        a = await TenantProc.start(env, "a", 60, "--turns", "1", "--linger", *first_flags)
        tenants.append(a)
        await a.until("done")
        b = await TenantProc.start(env, "b", 60, "--turns", "1", "--timeout", "20")
        tenants.append(b)
        assert await asyncio.to_thread(watch.seen.wait, 20)
        waiting = (await status(node))["tenants"]["local/b"]["waiting"]
        assert needle in waiting and needle in watch.messages[0]
        assert (await status(node))["tenants"]["local/a"]["residency"] == "resident"
        a.tell()
        await b.until("done")
    finally:
        logging.getLogger("agent.parking").removeHandler(watch)


def test_a_park_over_the_host_budget_is_refused_with_its_numbers():
    async def body(node, tenants):
        await refused(node, tenants, [], "over the 50 MiB budget")
        assert metric(node, "baton_refused_parks_total", reason="host_budget") >= 1

    run(with_node(FakeNodeOptions(fake_gpus="1x100", host_memory_budget_mib=50), body))


def test_a_tenant_whose_memory_limit_is_too_small_stays_resident():
    async def body(node, tenants):
        await refused(
            node, tenants, ["--limit-mib", "40"], "memory limit 40 MiB cannot hold its 60 MiB"
        )
        assert metric(node, "baton_refused_parks_total", reason="cgroup_limit") >= 1

    run(with_node(FakeNodeOptions(fake_gpus="1x100"), body))


def test_the_app_backend_parks_tenants_through_their_own_callbacks():
    async def body(node, tenants):
        env = node.tenant_env()
        a = await TenantProc.start(env, "a", 60, "--pause-after", "0", argv=APP_TENANT)
        tenants.append(a)
        await a.until("turn")
        async with node.agent.service.events.subscribe() as events:
            b = await TenantProc.start(env, "b", 60, "--turns", "1", argv=APP_TENANT)
            tenants.append(b)
            await b.until("done")
            assert await b.exit_code() == 0
            # b's session is over before a asks again: a's restore parks nobody else
            await asyncio.wait_for(gone(events, "local/b"), 30)
        assert [e["event"] for e in a.events] == ["turn"]
        assert (await a.event())["event"] == "parked"
        a.tell()
        await a.until("done")
        assert [e["event"] for e in a.events] == ["turn", "parked", "restored", "turn", "done"]
        moved = metric(node, "baton_moved_bytes_total", backend="app", direction="park")
        assert moved == 60 * 1024 * 1024

    run(with_node(FakeNodeOptions(backend="app", fake_gpus="1x100"), body))


async def gone(events: asyncio.Queue[ev.Event], tenant_id: str) -> None:
    """Return once the agent says `tenant_id` is gone."""
    while not ((e := await events.get()).kind == ev.TENANT_GONE and e.tenant_id == tenant_id):
        pass

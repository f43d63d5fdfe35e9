"""Restore-ahead: the waiter due next is made resident while the holder runs, so its grant
moves nothing. Tenant processes on an in-process agent (fake backend), over the real socket."""

from __future__ import annotations

import asyncio

import pytest

from agent.core import eager
from agent.core import events as ev
from agent.parking.backends.base import Move, TenantRef
from agent.parking.fakegpu import FakeGpuMemory
from agent.parking.preparer import ParkingPreparer
from baton.contract.names import MIB
from commands.demo.fakenode import FakeNode, FakeNodeOptions

from .conftest import GPU
from .nodeharness import TenantProc, run, with_node

pytestmark = pytest.mark.timeout(90)


def stage_bytes(preparer: ParkingPreparer, stage: str) -> dict[str, float]:
    """Bytes moved at `stage` ("grant", "ahead", "revoke"), per direction."""
    reg = preparer.metrics.registry
    name = "baton_moved_bytes_by_stage_total"
    return {
        d: reg.get_sample_value(name, {"backend": "fake", "direction": d, "stage": stage}) or 0.0
        for d in ("park", "restore")
    }


async def next_event(events: asyncio.Queue[ev.Event], kind: str, tenant: str) -> ev.Event:
    while True:
        event = await asyncio.wait_for(events.get(), 30)
        if event.kind == kind and event.tenant_id == f"local/{tenant}":
            return event


def test_the_next_waiter_is_restored_while_the_holder_runs_and_its_grant_moves_nothing():
    async def body(node: FakeNode, tenants: list[TenantProc]) -> None:
        prep = node.preparer
        assert prep is not None
        env = node.tenant_env()
        a = await TenantProc.start(env, "a", 40, "--turns", "2", "--pause-after", "0")
        tenants.append(a)
        await a.until("turn")
        b = await TenantProc.start(env, "b", 40, "--turns", "1", "--linger")
        tenants.append(b)
        await b.until("done")
        c = await TenantProc.start(env, "c", 40, "--turns", "1", "--hold")
        tenants.append(c)
        await c.until("holding")  # c's turn parked a, the least recently served: 3 x 40 > 100
        assert prep.status()["tenants"]["local/a"]["residency"] == "parked"
        async with node.agent.service.events.subscribe() as events:
            a.tell()  # a asks for its second turn while c holds the GPU
            await next_event(events, ev.QUEUED, "a")
            await prep.settled()
            residency = {t: s["residency"] for t, s in prep.status()["tenants"].items()}
            assert residency == {"local/a": "resident", "local/b": "parked", "local/c": "resident"}
            assert stage_bytes(prep, "ahead") == {"park": 40 * MIB, "restore": 40 * MIB}
            at_grant = stage_bytes(prep, "grant")
            c.tell()  # c yields: a's turn starts with its memory in place
            granted = await next_event(events, ev.GRANTED, "a")
        await a.until("done")  # a verified the data it wrote before it was parked and restored
        assert stage_bytes(prep, "grant") == at_grant, "the grant after restore-ahead moved bytes"
        assert granted.tokens == {GPU: 4}
        for t in (a, c):
            assert await t.exit_code() == 0, t.describe()

    run(with_node(FakeNodeOptions(fake_gpus="1x100"), body))


def test_a_grant_waits_for_the_restore_ahead_in_flight_instead_of_moving_twice(backend):
    prep = ParkingPreparer(backend, {GPU: 100 * MIB}, host_budget=1000 * MIB, backoff=0.0)
    restores: list[str] = []
    real_restore = backend.restore

    def counted_restore(tenant_id: str, gpu: str) -> Move:
        restores.append(tenant_id)
        return real_restore(tenant_id, gpu)

    backend.restore = counted_restore

    async def scenario() -> None:
        for i, name in enumerate(("a", "b", "c")):
            prep.register(TenantRef(name, (GPU,), declared_bytes=40 * MIB))
            await prep.prepare(name, [GPU])
            FakeGpuMemory(name, backend.root, timeout=1.0).allocate(GPU, 40)
            FakeGpuMemory(name, backend.root, timeout=1.0).write_pattern(GPU, i)
        assert prep.status()["tenants"]["a"]["residency"] == "parked"
        started, _, rest = eager.start(prep.prepare_ahead("a", [GPU], {"c"}))
        assert not started and rest is not None  # under way: it holds the plan lock
        ahead = asyncio.ensure_future(rest)
        await prep.prepare("a", [GPU])
        assert ahead.done()
        FakeGpuMemory("a", backend.root, timeout=1.0).verify_pattern(GPU, 0)

    asyncio.run(asyncio.wait_for(scenario(), 10))
    assert restores == ["a"], "the grant restored a again instead of awaiting the ahead"
    assert prep.status()["tenants"]["c"]["residency"] == "resident", "the holder was parked"


def test_a_tenant_that_leaves_while_readied_ahead_is_simply_forgotten(backend):
    prep = ParkingPreparer(backend, {GPU: 100 * MIB}, host_budget=1000 * MIB, backoff=0.0)

    async def scenario() -> None:
        for name in ("a", "b", "c"):
            prep.register(TenantRef(name, (GPU,), declared_bytes=40 * MIB))
            await prep.prepare(name, [GPU])
            FakeGpuMemory(name, backend.root, timeout=1.0).allocate(GPU, 40)
        started, _, rest = eager.start(prep.prepare_ahead("a", [GPU], {"c"}))
        assert not started and rest is not None
        ahead = asyncio.ensure_future(rest)
        await prep.forget("a")  # it left: its memory goes, whatever the ahead did with it
        assert ahead.done()
        await prep.prepare("b", [GPU])

    asyncio.run(asyncio.wait_for(scenario(), 10))
    residency = {t: s["residency"] for t, s in prep.status()["tenants"].items()}
    assert residency == {"b": "resident", "c": "resident"}
    assert prep.status()["parked_bytes"] == 0

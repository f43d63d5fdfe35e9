"""The real TurnPreparer over the fake backend: moves, refusals, preemption, status, metrics."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest
from prometheus_client import CollectorRegistry

from agent.core.residency import NoRoom
from agent.parking.backends.base import BackendError, TenantRef
from agent.parking.fakegpu import FakeGpuMemory
from agent.parking.preparer import ParkingPreparer
from baton.contract.names import MIB

from .conftest import GPU


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


def metric(reg, name, **labels):
    return reg.get_sample_value(name, labels) or 0.0


def setup(backend, *tenants, budget=1000, limit=None):
    """Tenants that each take a first turn, allocate their memory and write a pattern."""
    reg = CollectorRegistry()
    prep = ParkingPreparer(
        backend, {GPU: 100 * MIB}, host_budget=budget * MIB, registry=reg, backoff=0.0
    )
    mems = {}

    async def first_turn(i, name, mib):
        prep.register(TenantRef(name, (GPU,), declared_bytes=mib * MIB))
        await prep.prepare(name, [GPU])
        mems[name] = FakeGpuMemory(name, backend.root, timeout=1.0)
        mems[name].allocate(GPU, mib, memory_limit_mib=limit if i == 0 else None)
        mems[name].write_pattern(GPU, i)

    for i, (name, mib) in enumerate(tenants):
        run(first_turn(i, name, mib))
    return prep, reg, mems


def test_small_tenants_take_turns_without_a_single_copy(backend):
    prep, reg, _ = setup(backend, ("a", 30), ("b", 30), ("c", 30))

    async def turns():
        for name in "abcabc":
            await prep.prepare(name, [GPU])
        await prep.settled()  # the reads that follow the turns

    run(turns())
    assert metric(reg, "baton_moves_total", backend="fake", direction="park") == 0
    assert {t["residency"] for t in prep.status()["tenants"].values()} == {"resident"}


def test_turns_park_the_least_recently_served_and_restore_the_incoming(backend):
    prep, reg, mems = setup(backend, ("a", 60), ("b", 60))

    async def turns():
        for name in "abab":
            await prep.prepare(name, [GPU])
            mems[name].verify_pattern(GPU, "ab".index(name))

    run(turns())
    status = prep.status()
    assert status["tenants"]["a"]["residency"] == "parked"
    assert status["tenants"]["b"]["residency"] == "resident"
    assert status["parked_bytes"] == 60 * MIB
    assert status["tenants"]["b"]["last_turn"]
    # b's first turn parked a; then a, b, a, b each parked the other and restored themselves.
    assert metric(reg, "baton_moves_total", backend="fake", direction="park") == 5
    assert metric(reg, "baton_moves_total", backend="fake", direction="restore") == 4
    assert metric(reg, "baton_moved_bytes_total", backend="fake", direction="park") == 300 * MIB
    assert metric(reg, "baton_parked_bytes") == 60 * MIB


def test_a_park_over_the_host_budget_is_refused_and_shown(backend):
    prep, reg, _ = setup(backend, ("a", 60), budget=50)
    prep.register(TenantRef("b", (GPU,), declared_bytes=60 * MIB))
    with pytest.raises(NoRoom, match="over the 50 MiB budget"):
        run(prep.prepare("b", [GPU]))
    assert "50 MiB budget" in prep.status()["tenants"]["b"]["waiting"]
    assert metric(reg, "baton_refused_parks_total", reason="host_budget") == 1
    assert prep.status()["tenants"]["a"]["residency"] == "resident"


def test_a_tenant_whose_memory_limit_is_too_small_is_never_parked(backend):
    prep, reg, _ = setup(backend, ("a", 60), limit=40)
    prep.register(TenantRef("b", (GPU,), declared_bytes=60 * MIB))
    with pytest.raises(NoRoom, match="memory limit 40 MiB cannot hold its 60 MiB"):
        run(prep.prepare("b", [GPU]))
    status = prep.status()["tenants"]
    assert "memory limit" in status["a"]["not_parkable"]
    assert metric(reg, "baton_refused_parks_total", reason="cgroup_limit") == 1


def test_revoke_parks_the_holder_and_its_next_turn_restores_it(backend):
    prep, reg, mems = setup(backend, ("a", 60), ("b", 60))

    async def preempt():
        await prep.prepare("a", [GPU])
        await prep.revoke("a", [GPU])
        assert prep.status()["tenants"]["a"]["residency"] == "parked"
        await prep.prepare("b", [GPU])
        await prep.prepare("a", [GPU])

    run(preempt())
    mems["a"].verify_pattern(GPU, 0)
    assert metric(reg, "baton_preemptions_total") == 1


def test_a_failing_park_is_retried_then_reported_and_the_tenant_stays(backend, monkeypatch):
    prep, reg, mems = setup(backend, ("a", 60), ("b", 60))
    run(prep.prepare("a", [GPU]))

    def broken(tenant_id, gpu):
        raise BackendError("lock timed out")

    monkeypatch.setattr(backend, "park", broken)
    with pytest.raises(NoRoom, match="failed 3 times; last error: lock timed out"):
        run(prep.prepare("b", [GPU]))
    assert metric(reg, "baton_move_failures_total", backend="fake", direction="park") == 3
    assert prep.status()["tenants"]["a"]["residency"] == "resident"
    mems["a"].verify_pattern(GPU, 0)


def test_forget_releases_parked_bytes(backend):
    prep, _, _ = setup(backend, ("a", 60), ("b", 60))

    async def go():
        await prep.prepare("a", [GPU])
        await prep.prepare("b", [GPU])
        await prep.forget("a")

    run(go())
    assert prep.status()["parked_bytes"] == 0 and "a" not in prep.status()["tenants"]


def test_declared_footprint_and_registered_limit_count(backend):
    prep, _, _ = setup(backend, ("a", 10))
    prep.register(TenantRef("a", (GPU,), memory_limit_bytes=5 * MIB, declared_bytes=70 * MIB))
    prep.register(TenantRef("b", (GPU,), declared_bytes=50 * MIB))
    run(prep.prepare("a", [GPU]))
    with pytest.raises(NoRoom, match="memory limit 5 MiB cannot hold its 70 MiB"):
        run(prep.prepare("b", [GPU]))


class Host:
    """A `ParkingHost` whose tenants the test removes (as a session's end does) or changes."""

    def __init__(self, *names: str, mib: int = 60) -> None:
        self.refs = {n: TenantRef(n, (GPU,), declared_bytes=mib * MIB) for n in names}

    def tenant_refs(self):
        return dict(self.refs)

    def quarantine(self, tenant_id, why):
        raise AssertionError(f"{tenant_id} quarantined: {why}")

    def persist(self):
        pass


def test_a_tenant_whose_session_ends_during_its_park_is_forgotten_not_retried(backend):
    host = Host("a", "b")
    prep = ParkingPreparer(backend, {GPU: 100 * MIB}, host_budget=1000 * MIB, host=host)
    run(prep.prepare("a", [GPU]))
    FakeGpuMemory("a", backend.root, timeout=1.0).allocate(GPU, 60)
    tries = []

    def session_ends(tenant_id, gpu):  # a's on_park meets its closed session
        tries.append(tenant_id)
        del host.refs[tenant_id]
        raise BackendError(f"{tenant_id}: on_park({gpu}) failed: tenant {tenant_id} disconnected")

    backend.park = session_ends
    run(prep.prepare("b", [GPU]))  # granted at once: no backoff, no refusal
    assert tries == ["a"] and "a" not in prep.status()["tenants"]
    assert (
        metric(prep.metrics.registry, "baton_move_failures_total", backend="fake", direction="park")
        == 0
    )


def test_a_tenant_whose_session_ends_during_its_park_as_the_plan_is_cancelled_is_not_a_failure(
    backend, caplog
):
    """The agent stops while a's park runs in a worker thread, and a's session ends meanwhile:
    its park fails as a departed tenant's does, skipped, not counted as a failed move."""
    host = Host("a", "b")
    prep = ParkingPreparer(backend, {GPU: 100 * MIB}, host_budget=1000 * MIB, host=host)
    run(prep.prepare("a", [GPU]))
    FakeGpuMemory("a", backend.root, timeout=1.0).allocate(GPU, 60)
    parking, let_go = threading.Event(), threading.Event()

    def session_ends(tenant_id, gpu):  # a's park meets its closed session as it ends
        parking.set()
        assert let_go.wait(10)
        del host.refs[tenant_id]
        raise BackendError(f"{tenant_id}: on_park({gpu}) failed: tenant {tenant_id} disconnected")

    backend.park = session_ends

    async def stop_during_the_park():
        task = asyncio.ensure_future(prep.prepare("b", [GPU]))
        assert await asyncio.to_thread(parking.wait, 10)
        task.cancel()  # the agent stops
        await asyncio.sleep(0)
        let_go.set()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()

    caplog.set_level(logging.INFO)
    run(stop_during_the_park())
    assert "a left during its park: skipped" in caplog.messages
    assert (
        metric(prep.metrics.registry, "baton_move_failures_total", backend="fake", direction="park")
        == 0
    )

"""Who the preparer counts as holding a turn (busy: never parked; may allocate): a turn held
across an agent restart does, a turn that ended does not, and a tenant with two turns holds
the other's GPUs when one ends."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from agent.core.errors import AcquireTimeout, AgentError
from agent.core.leases import LeaseTable
from agent.node.state import StateStore
from agent.node.tenants import POD, Tenant
from agent.parking.backends.base import Residency
from agent.parking.backends.fake import FakeBackend
from agent.parking.fakegpu import FakeGpuMemory
from agent.parking.host import ParkingHost
from agent.parking.preparer import ParkingPreparer
from agent.server.service import LeaseService
from baton.contract.names import MIB

from .conftest import GPU, GPU1, SCALE
from .test_left_waiters import WAIT_S, held_parks


def agent(tmp_path: Path) -> tuple[LeaseService, ParkingPreparer, FakeBackend]:
    """An agent over two simulated 100 MiB GPUs, its state (loaded) under `tmp_path`."""
    backend = FakeBackend(
        tmp_path / "fakegpu", {GPU: 100 * MIB, GPU1: 100 * MIB}, scale=SCALE, lock_timeout=2.0
    )
    made: list[ParkingPreparer] = []

    def preparer(host: ParkingHost) -> ParkingPreparer:
        made.append(ParkingPreparer(backend, backend.gpus, host_budget=1000 * MIB, host=host))
        return made[0]

    service = LeaseService(
        table=LeaseTable(clock=time.time),
        preparer=preparer,
        clock=time.time,
        store=StateStore(tmp_path / "state"),
    )
    service.load()
    return service, made[0], backend


def pod(name: str, gpu: str, mib: int) -> Tenant:
    return Tenant(f"team/{name}", name, (gpu,), gpu_memory_mib=mib, source=POD)


def residency(prep: ParkingPreparer) -> dict[str, str]:
    return {t: e["residency"] for t, e in prep.status()["tenants"].items()}


def test_a_turn_held_across_a_restart_is_made_room_for_at_the_next_grant(tmp_path: Path) -> None:
    h, x, y = pod("h", GPU, 60), pod("x", GPU, 60), pod("y", GPU1, 10)
    root = tmp_path / "fakegpu"

    async def before() -> None:
        service, prep, backend = agent(tmp_path)
        for tenant in (h, x, y):
            service.upsert_pod(tenant)
        granted = await service.acquire(x, (), timeout=5)
        FakeGpuMemory(x.tenant_id, root).allocate(GPU, 60)
        service.yield_(x, granted.lease.lease_id)
        await service.acquire(h, (), timeout=5)  # x is parked for h's 60 MiB
        await prep.settled()
        assert residency(prep)["team/x"] == "parked"
        await service.close()  # the agent stops while h holds its turn
        backend.close()

    async def after() -> None:
        service, prep, backend = agent(tmp_path)
        [lease] = service.state.table.leases_of(h.tenant_id)  # h's turn goes on
        await service.acquire(y, (), timeout=5)  # the first grant reads the node: h holds 0
        FakeGpuMemory(h.tenant_id, root).allocate(GPU, 60)  # h allocates during its turn
        service.yield_(h, lease.lease_id)
        await service.acquire(x, (), timeout=5)
        await prep.settled()
        on_gpu = {
            t: st.footprint_bytes.get(GPU, 0) // MIB
            for t in backend.tenants()
            if (st := backend.state(t)).residency.get(GPU) == Residency.RESIDENT
        }
        assert on_gpu == {x.tenant_id: 60}, f"resident on a 100 MiB GPU (MiB): {on_gpu}"
        assert residency(prep) == {"team/h": "parked", "team/x": "resident", "team/y": "none"}
        await service.close()
        backend.close()

    asyncio.run(asyncio.wait_for(before(), 10))
    asyncio.run(asyncio.wait_for(after(), 10))


def test_a_turn_on_some_of_a_tenants_gpus_holds_nothing_once_it_ends(tmp_path: Path) -> None:
    # t uses both GPUs but takes a turn on GPU 0 alone; once it yields, z's turn on GPU 1
    # parks t (it was held busy on both GPUs until a turn was granted on GPU 0).
    t = Tenant("team/t", "t", (GPU, GPU1), gpu_memory_mib=60, source=POD)
    z = pod("z", GPU1, 60)

    async def turns() -> None:
        service, prep, backend = agent(tmp_path)
        service.upsert_pod(t)
        service.upsert_pod(z)
        granted = await service.acquire(t, (GPU,), timeout=5)
        mem = FakeGpuMemory(t.tenant_id, tmp_path / "fakegpu")
        mem.allocate(GPU, 60)
        mem.allocate(GPU1, 60)
        service.yield_(t, granted.lease.lease_id)
        try:
            await service.acquire(z, (), timeout=2)
        except AgentError as e:
            raise AssertionError(f"z never got GPU 1 after t yielded: {e}") from None
        assert prep.residency_of(t.tenant_id) == {GPU: "parked", GPU1: "parked"}
        await service.close()
        backend.close()

    asyncio.run(asyncio.wait_for(turns(), 10))


def test_a_tenant_holds_its_gpu_while_another_of_its_turns_ends(tmp_path: Path) -> None:
    # t's two processes take turns of their own, one a GPU. Once the turn on GPU 1 ends, t
    # still holds GPU 0 (it may allocate there), so it is not read as settled mid-turn: when
    # its turn on GPU 0 ends, x's grant there reads it grown and parks it.
    t = Tenant("team/t", "t", (GPU, GPU1), source=POD)
    z, x = pod("z", GPU1, 10), pod("x", GPU, 60)
    root = tmp_path / "fakegpu"

    async def turns() -> dict[str, int]:
        service, prep, backend = agent(tmp_path)
        for tenant in (t, z, x):
            service.upsert_pod(tenant)
        on_0 = await service.acquire(t, (GPU,), timeout=5)
        on_1 = await service.acquire(t, (GPU1,), timeout=5)
        mem = FakeGpuMemory(t.tenant_id, root)
        mem.allocate(GPU, 30)
        mem.allocate(GPU1, 10)
        service.yield_(t, on_1.lease.lease_id)
        await service.acquire(z, (), timeout=5)
        await prep.settled()  # (the tenants whose turns ended are read meanwhile)
        mem.allocate(GPU, 90)  # the process on GPU 0 grows during its turn
        service.yield_(t, on_0.lease.lease_id)
        await service.acquire(x, (), timeout=5)
        FakeGpuMemory(x.tenant_id, root).allocate(GPU, 60)
        await prep.settled()
        on_gpu = {
            tid: st.footprint_bytes.get(GPU, 0) // MIB
            for tid in backend.tenants()
            if (st := backend.state(tid)).residency.get(GPU) == Residency.RESIDENT
        }
        await service.close()
        backend.close()
        return on_gpu

    on_gpu = asyncio.run(asyncio.wait_for(turns(), 10))
    assert on_gpu == {x.tenant_id: 60}, f"resident on a 100 MiB GPU (MiB): {on_gpu}"


@pytest.mark.parametrize("how", ["its caller went away", "its deadline passed"])
def test_an_acquire_given_up_while_room_is_made_holds_nothing(tmp_path: Path, how: str) -> None:
    # t uses both GPUs and asks for GPU 0, where x's memory must be parked for it. t's acquire
    # is given up while that park runs (its caller cancels it, or the deadline its caller keeps
    # passes: llm-d's asks); the park ends, and t's turn is never granted: t holds nothing, so
    # z's turn on GPU 1 parks t at once (t was held busy until a grant on GPU 0).
    t = Tenant("team/t", "t", (GPU, GPU1), gpu_memory_mib=60, source=POD)
    x, z = pod("x", GPU, 60), pod("z", GPU1, 60)
    root = tmp_path / "fakegpu"

    async def turns() -> None:
        service, prep, backend = agent(tmp_path)
        for tenant in (t, x, z):
            service.upsert_pod(tenant)
        granted = await service.acquire(x, (), timeout=5)
        FakeGpuMemory(x.tenant_id, root).allocate(GPU, 60)
        FakeGpuMemory(t.tenant_id, root).allocate(GPU1, 60)
        service.yield_(x, granted.lease.lease_id)
        await prep.settled()
        parking, let_go = held_parks(backend)
        asked = asyncio.ensure_future(service.acquire(t, (GPU,), timeout=None))
        assert await asyncio.to_thread(parking.wait, WAIT_S)  # x's park for t runs
        if how == "its caller went away":
            asked.cancel()
        else:
            [waiter] = service.state.table.waiters.values()
            service.expire(waiter.waiter_id, AcquireTimeout("no turn in time"), "its deadline")
        with pytest.raises((asyncio.CancelledError, AgentError)):
            await asyncio.wait_for(asked, WAIT_S)
        let_go.set()
        await prep.settled()
        assert not service.state.table.leases_of(t.tenant_id)
        try:
            await service.acquire(z, (), timeout=2)
        except AgentError as e:
            raise AssertionError(f"z never got GPU 1, t counted busy there: {e}") from None
        assert prep.residency_of(t.tenant_id)[GPU1] == "parked"
        assert t.tenant_id not in prep._holding, "t is counted holding a turn it never got"
        await service.close()
        backend.close()

    asyncio.run(asyncio.wait_for(turns(), 20))

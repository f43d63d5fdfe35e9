"""The app backend drives tenant callbacks on the agent's loop from worker threads."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from agent.parking.backends.app import AppBackend
from agent.parking.backends.base import BackendError, Residency, TenantRef
from agent.parking.preparer import ParkingPreparer
from baton.contract.names import MIB

GPU = "GPU-0"


class Tenant:
    """A tenant that answers callbacks, optionally failing or never answering."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.calls: list[tuple[str, str]] = []
        self.fail = ""
        self.hang = False
        self.takes = 0.0
        """Seconds each callback takes."""
        self.given: list[float] = []
        """The timeout each callback was given."""

    async def __call__(self, tenant_id: str, action: str, gpu: str, timeout: float) -> int:
        self.calls.append((action, gpu))
        self.given.append(timeout)
        if self.takes:
            await asyncio.sleep(self.takes)  # the callback's own work: it moves memory
        if self.hang:
            await asyncio.wait_for(asyncio.Event().wait(), timeout)
        if self.fail:
            raise RuntimeError(self.fail)
        return self.nbytes


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """The agent's event loop, in a thread of its own; the backend is called from this one."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def drive(backend: AppBackend, tenant: Tenant, steps):
    return [getattr(backend, s)("t", GPU) for s in steps]


def test_park_and_restore_run_the_callbacks_and_count_reported_bytes(loop):
    tenant = Tenant(5000)
    backend = AppBackend(timeout=1.0, call_tenant=tenant, loop=loop)
    backend.attach(TenantRef("t", (GPU,), declared_bytes=100))
    assert backend.footprint("t", GPU) == 100
    park, again = drive(backend, tenant, ["park", "park"])
    assert (park.bytes, again.bytes) == (5000, 0)
    assert backend.state("t").residency == {GPU: Residency.PARKED}
    assert backend.state("t").parked_bytes == 5000
    (restore,) = drive(backend, tenant, ["restore"])
    assert restore.bytes == 5000 and tenant.calls == [("park", GPU), ("restore", GPU)]
    assert backend.state("t").residency == {GPU: Residency.RESIDENT}
    assert backend.footprint("t", GPU) == 5000


PARK, RESTORE = ("park", GPU), ("restore", GPU)


def take_turns(
    loop, tenants: dict[str, Tenant], refs: list[TenantRef], order: str, headroom: int = 0
):
    """The real preparer over an app backend on a 100 MiB GPU (`headroom` kept free): `refs`
    register, then the tenants named in `order` take their turns one after another."""

    async def call(tenant_id: str, action: str, gpu: str, timeout: float) -> int:
        return await tenants[tenant_id](tenant_id, action, gpu, timeout)

    backend = AppBackend(timeout=1.0, call_tenant=call, loop=loop)
    prep = ParkingPreparer(
        backend,
        {GPU: 100 * MIB},
        host_budget=1000 * MIB,
        registry=CollectorRegistry(),
        headroom=headroom,
    )

    async def turns() -> None:
        for ref in refs:
            prep.register(ref)
        for name in order:
            await prep.prepare(name, [GPU])

    asyncio.run(asyncio.wait_for(turns(), 10))
    return backend, prep


def test_a_tenant_parked_before_it_allocated_is_parked_again_once_it_has_run(loop):
    """Its first on_park moved 0 bytes; during the turns since it may have allocated what it
    declared, so the other tenant's next turn parks it again rather than squeezing in beside it."""
    tenants = {"a": Tenant(0), "b": Tenant(60 * MIB)}
    refs = [TenantRef(name, (GPU,), declared_bytes=60 * MIB) for name in "ab"]
    backend, _ = take_turns(loop, tenants, refs, "baba")
    assert tenants["a"].calls == [PARK, RESTORE, PARK, RESTORE]
    assert tenants["b"].calls == [PARK, RESTORE, PARK]
    assert backend.footprint("a", GPU) == 60 * MIB  # resident, reported 0: what it declared


def test_self_parking_tenants_that_declared_nothing_may_hold_the_whole_gpu(loop):
    """Undeclared, what they hold is unknown until a park reports it, and may grow in any turn:
    each switch parks the other one (they used to count as holding nothing, never parked)."""
    tenants = {"a": Tenant(60 * MIB), "b": Tenant(60 * MIB)}
    refs = [TenantRef(name, (GPU,), self_parks=True) for name in "ab"]
    _, prep = take_turns(loop, tenants, refs, "abab")
    assert tenants["a"].calls == [PARK, RESTORE, PARK]
    assert tenants["b"].calls == [PARK, RESTORE, PARK, RESTORE]
    assert prep.status()["tenants"]["a"]["residency"] == "parked"
    for name in "ab":  # one tenant's residency, as the whole status says it
        assert prep.residency_of(name) == prep.status()["tenants"][name]["gpus"]
    assert prep.residency_of("a") == {GPU: "parked"} and prep.residency_of("c") == {}


def test_undeclared_self_parkers_take_turns_beside_the_headroom(loop):
    """With headroom kept free (2304 MiB on real GPUs), the whole GPU an undeclared tenant may
    hold was more than a turn may have: its every turn was refused as too large."""
    tenants = {"a": Tenant(60 * MIB), "b": Tenant(20 * MIB)}
    refs = [TenantRef(name, (GPU,), self_parks=True) for name in "ab"]
    take_turns(loop, tenants, refs, "abab", headroom=10 * MIB)
    assert tenants["a"].calls == [PARK, RESTORE, PARK]
    assert tenants["b"].calls == [PARK, RESTORE, PARK, RESTORE]


def test_a_failing_or_late_callback_leaves_the_tenant_resident(loop):
    tenant = Tenant(1)
    backend = AppBackend(timeout=0.05, call_tenant=tenant, loop=loop)
    backend.attach(TenantRef("t", (GPU,)))
    tenant.fail = "out of pinned memory"
    with pytest.raises(BackendError, match=r"on_park.*out of pinned memory"):
        drive(backend, tenant, ["park"])
    tenant.fail, tenant.hang = "", True
    with pytest.raises(BackendError, match="on_park"):
        drive(backend, tenant, ["park"])
    assert backend.state("t").residency == {GPU: Residency.RESIDENT}


def test_a_large_tenant_gets_the_time_its_bytes_take(loop):
    """A fixed --move-timeout (5 s) cut short the park of a model of tens of GB moved at a few
    GB/s; the callback is given the timeout and its bytes at the slowest copy rate."""
    tenant = Tenant(int(0.5e9))
    backend = AppBackend(timeout=0.05, call_tenant=tenant, loop=loop, copy_gbps=2.0)
    backend.attach(TenantRef("t", (GPU,), declared_bytes=int(1e9)))
    tenant.takes = 0.3  # past the timeout alone, within the 0.5 s its declared 1 GB takes
    park, restore = drive(backend, tenant, ["park", "restore"])
    assert (park.bytes, restore.direction) == (int(0.5e9), "restore")
    assert tenant.given == [pytest.approx(0.55), pytest.approx(0.3)]  # restore: what it parked
    tenant.takes, tenant.hang = 0.0, True
    with pytest.raises(BackendError, match=r"did not finish on_park\(GPU-0\) within 0.55 s"):
        drive(backend, tenant, ["park"])


def test_unbound_backend_says_so():
    backend = AppBackend()
    backend.attach(TenantRef("t", (GPU,)))
    with pytest.raises(BackendError, match="not connected"):
        backend.park("t", GPU)


def test_app_handovers_run_on_the_event_loop_without_a_worker_thread(loop, monkeypatch):
    """Reads and callbacks of the app backend are awaited where they run: a handover that
    parks one tenant and restores the other hops to no thread."""

    def no_thread(*args, **kwargs):
        raise AssertionError("an app handover went to a worker thread")

    monkeypatch.setattr(asyncio, "to_thread", no_thread)
    tenants = {"a": Tenant(60 * MIB), "b": Tenant(60 * MIB)}
    refs = [TenantRef(name, (GPU,), declared_bytes=60 * MIB) for name in "ab"]
    _, prep = take_turns(loop, tenants, refs, "abab")
    assert tenants["a"].calls == [PARK, RESTORE, PARK]
    assert prep.status()["tenants"]["a"]["residency"] == "parked"

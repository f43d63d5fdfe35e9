"""The app backend drives tenant callbacks on the agent's loop from worker threads."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from agent.parking.backends.app import AppBackend
from agent.parking.backends.base import BackendError, Residency, TenantRef

GPU = "GPU-0"


class Tenant:
    """A tenant that answers callbacks, optionally failing or never answering."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.calls: list[tuple[str, str]] = []
        self.fail = ""
        self.hang = False

    async def __call__(self, tenant_id: str, action: str, gpu: str, timeout: float) -> int:
        self.calls.append((action, gpu))
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


def test_unbound_backend_says_so():
    backend = AppBackend()
    backend.attach(TenantRef("t", (GPU,)))
    with pytest.raises(BackendError, match="not connected"):
        backend.park("t", GPU)

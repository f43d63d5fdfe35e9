"""A pod's process ends while a move holds the parking lock, so that the forget of what it left
waits for the lock; its container's new process is granted a turn in the step the move lets the
lock go (a revocation that ends the holder's lease and hands its GPU on), before the forget has
taken the lock it was handed: that turn waits for the forget, and keeps what it records."""

from __future__ import annotations

import asyncio

from agent.core import eager
from agent.parking.fakegpu import FakeGpuMemory
from agent.parking.preparer import ParkingPreparer
from baton.contract.names import MIB

from .conftest import GPU
from .test_preparer import Host, run


def test_a_turn_granted_as_the_lock_passes_to_a_forget_of_its_tenant_waits_for_the_forget(
    backend,
):
    """a (a pod: it stays counted) took a turn; its process ends and its forget queues behind a
    move. a's new process is prepared as the move releases the lock: the model still showed the
    departed process resident, so the grant took the model's word at once (no lock, no wait),
    and the forget, run next, dropped the new turn (a no longer counted holding its GPU)."""
    prep = ParkingPreparer(backend, {GPU: 100 * MIB}, host_budget=1000 * MIB, host=Host("a"))

    async def go() -> None:
        await prep.prepare("a", [GPU])
        FakeGpuMemory("a", backend.root, timeout=1.0).allocate(GPU, 60)
        prep.released("a", [GPU])
        await prep.settled()
        lock = prep._lock
        await lock.acquire()  # a move of another tenant runs
        forget = asyncio.ensure_future(prep.forget("a"))  # a's process ended: it waits
        for _ in range(100):  # bounded: the forget queues on the lock in its first step
            if forget.done() or lock._waiters:
                break
            await asyncio.sleep(0)
        assert lock._waiters and not forget.done()
        lock.release()  # the move ends, and in the same step the GPU goes to a's new process
        _, _, rest = eager.start(prep.prepare("a", [GPU]))
        granted_first = rest is None
        if rest is not None:
            await asyncio.wait_for(asyncio.ensure_future(_finish(rest)), 5)
        await asyncio.wait_for(forget, 5)
        assert prep._holding.get("a") == frozenset({GPU}), "the forget dropped a's new turn"
        assert not granted_first, "a's new turn was planned from its departed process's state"

    run(go())


async def _finish(rest: eager.Rest[None]) -> None:
    await rest

"""A holder past its maximum that yields while its revocation waits on the node (here: its
re-read of every tenant, held by the test) is not parked for nobody: its waiter gave up, it
asks again and takes its next turn with its memory where it was, moved neither way."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from agent.client import AcquireTimeout, Baton
from agent.parking.backends.base import Residency
from agent.parking.backends.fakegpu import FakeGpuMemory
from baton.contract.names import fake_gpu_uuid
from tests.harness.agent import AgentRunner, one_small_fake_gpu

GPU = fake_gpu_uuid(0)
WAIT_S = 10.0
pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("way", ["it yields and asks again", "it holds on"])
def test_a_holder_whose_waiter_left_during_its_revocation_is_not_parked(
    workdir: str, way: str
) -> None:
    """Its waiter gave up while the revocation read the node: a holder that yields takes its
    next turn with nothing moved; one that holds on keeps its turn, unrevoked and unparked."""
    parking = one_small_fake_gpu(workdir)
    agent = AgentRunner(workdir, parking=parking, max_hold=0.3).start()
    a = Baton(agent.config.socket, [GPU], name="a")
    b = Baton(agent.config.socket, [GPU], name="b")
    reading, let_go = threading.Event(), threading.Event()
    prep = agent.service.preparer
    reread = prep._reread  # type: ignore[attr-defined]

    async def held_read(busy: Sequence[str] = ()) -> Any:
        """The revocation's read of the node waits for the test (under the preparer's lock)."""
        if agent.service.revocations.running and not reading.is_set():
            reading.set()
            assert await asyncio.to_thread(let_go.wait, WAIT_S)
        return await reread(busy)

    prep._reread = held_read  # type: ignore[attr-defined]
    try:
        first = a.acquire(timeout=WAIT_S)
        FakeGpuMemory("local/a", parking.fake_dir).allocate(GPU, 30)
        with pytest.raises(AcquireTimeout):  # a is revoked for b at 0.3 s; b gives up at 1 s
            b.acquire(timeout=1.0)
        assert reading.wait(WAIT_S)  # the revocation holds the node, reading it
        if way == "it holds on":
            let_go.set()
            agent.call(prep.settled())  # type: ignore[attr-defined]  # the revocation ended
            gpu = agent.status()["gpus"][GPU]
            assert gpu["holder"] == "local/a" and gpu["lease_id"] == first.lease_id
            assert not [e for e in agent.seen if e.kind == "revoked"]
            assert agent.moves("park") == 0
            return
        a.yield_()  # before it is parked: nobody waits for its GPU any more
        mark = agent.mark()
        again: list[Any] = []
        asking = threading.Thread(target=lambda: again.append(a.acquire(timeout=WAIT_S)))
        asking.start()
        agent.wait_event(lambda e: e.kind == "queued" and e.tenant_id == "local/a", since=mark)
        let_go.set()
        asking.join(WAIT_S)
        assert again and again[0].lease_id != first.lease_id
        gpu = agent.status()["gpus"][GPU]
        assert gpu["holder"] == "local/a" and gpu["lease_id"] == again[0].lease_id
        assert not [e for e in agent.seen if e.kind == "revoked"]
        # a's memory stayed on the GPU: parked for nobody, it would be restored for its turn.
        assert prep.backend.state("local/a").residency == {GPU: Residency.RESIDENT}  # type: ignore[attr-defined]
        assert agent.moves("park") == 0 and agent.moves("restore") == 0
        a.yield_()
    finally:
        let_go.set()
        a.close()
        b.close()
        agent.stop()

"""llm-d's Acquire by the job that holds the turn already: answered at once, and told so (it
waited for nothing and nothing was restored for it), as the node agent's orchestrator answers."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent.core.leases import LeaseTable
from baton._pb import timeslice_orchestrator_pb2 as ts
from tests.coordinator.test_llmd import run, serve, shut


def test_a_second_acquire_by_the_holder_says_it_waited_for_nothing(tmp_path: Path) -> None:
    async def body() -> None:
        heard: asyncio.Queue[str] = asyncio.Queue()
        nodes, arbiter, server, stub = await serve(tmp_path, caller="team", heard=heard)
        now = [1000.0]
        arbiter.clock = lambda: now[0]  # the coordinator's clock, moved by hand
        arbiter.table = LeaseTable(clock=arbiter.clock)
        try:
            blocker = nodes[0].add_pod("team/local", ("GPU-n1",))
            held = await nodes[0].service.acquire(blocker, (), timeout=5)  # n1 makes room later
            request = ts.AcquireRequest(job_id="rl", group_id="train")
            first = asyncio.ensure_future(stub.Acquire(request, timeout=10))
            await heard.get()  # it waits for its turn
            now[0] += 5.0
            nodes[0].service.yield_(blocker, held.lease.lease_id)
            assert (await first).waited_ms == 5000
            now[0] += 1.0
            again = await stub.Acquire(request, timeout=10)  # the holder asks again
            assert (again.success, again.waited_ms, again.context_restored) == (True, 0, False)
            answer = await stub.Yield(ts.YieldRequest(job_id="rl", group_id="train"), timeout=5)
            assert answer.success
        finally:
            await shut(nodes, arbiter, server)

    run(body)

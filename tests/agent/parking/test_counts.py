"""What the agent's counters say against what happened on a fake node, over the real socket."""

from __future__ import annotations

import asyncio

import pytest

from agent.core import events as ev
from commands.demo.fakenode import FakeNodeOptions

from .nodeharness import TenantProc, run, with_node
from .test_fake_node import metric

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

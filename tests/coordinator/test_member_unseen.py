"""A member pod that asks for its job's turn before the coordinator's pod watch shows it (a watch
that lags, relists after an outage): no turn is prepared without it, which nobody would end."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agent.core.errors import AcquireTimeout
from agent.server import api_ops
from baton._pb import agent_pb2 as pb
from tests.coordinator.test_members import cluster, pod, release, run, until


def plans(arbiter: Any) -> asyncio.Queue[None]:
    """A queue that gets an item as the coordinator plans a job's turn (a Join is weighed)."""
    planned = asyncio.Queue[None]()
    plan = arbiter.view.plan

    def planning(*args: Any, **kwargs: Any) -> Any:
        planned.put_nowait(None)
        return plan(*args, **kwargs)

    arbiter.view.plan = planning
    return planned


def test_a_member_the_coordinator_does_not_see_yet_waits_for_it_and_holds_nothing(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        async with cluster(tmp_path) as (n1, n2, arbiter):
            sampler, planned = pod(n2, "rl-sampler"), plans(arbiter)
            seen = arbiter.view.members.pop("team/rl-sampler")  # its watch has not shown it
            with pytest.raises(AcquireTimeout, match="does not see pod team/rl-sampler"):
                await api_ops.acquire(n2.service, sampler, pb.AcquireRequest(timeout_ms=600))
            assert not arbiter.held and not n1.holders()  # no turn that nobody would end
            asked = asyncio.ensure_future(
                api_ops.acquire(n2.service, sampler, pb.AcquireRequest(timeout_ms=10_000))
            )
            while not planned.empty():
                planned.get_nowait()
            await asyncio.wait_for(planned.get(), 5)  # weighed (and refused) once more
            arbiter.view.members["team/rl-sampler"] = seen  # the watch catches up
            lease = await asyncio.wait_for(asked, 10)
            assert n1.holders() == {"GPU-n1": "team/rl-trainer"}
            assert n2.holders() == {"GPU-n2": "team/rl-sampler"}
            release(n2.service, sampler, lease)  # the only member that joined: the turn ends
            await until(lambda: not arbiter.held and not n1.holders(), "the job's turn ends")
            sft = await api_ops.acquire(
                n1.service, pod(n1, "sft-a"), pb.AcquireRequest(timeout_ms=5000)
            )
            release(n1.service, pod(n1, "sft-a"), sft)

    run(body)

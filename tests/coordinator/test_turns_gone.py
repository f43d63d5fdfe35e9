"""A job turn none of whose pods is left in the cluster (the job deleted, or finished without a
Yield) ends, so its GPUs go to the next job; not before every pods' watch has listed once. A
member that left while its job waited is not prepared: the rest of the job gets the turn."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from coordinator.jobturn import JobTurn
from coordinator.turns import Arbiter
from tests.coordinator.loopback import leading
from tests.coordinator.test_turns import check_no_overlap, close, cluster, run


def test_a_turn_whose_pods_all_left_the_cluster_ends_and_the_next_job_gets_its_gpus(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        async with cluster(tmp_path) as (nodes, view):
            arbiter = await leading(view)
            await arbiter.acquire("team", "rl", "", timeout=5)  # llm-d's Acquire: nobody joined
            for node, pod in zip(nodes, ("team/rl-trainer", "team/rl-sampler"), strict=True):
                del view.members[pod]  # the job's pods were deleted (its loop cannot yield now)
                node.service.pod_gone(pod)
            listed = view.listed_once("pods timeslice.io/job-id")  # a watch not listed yet
            arbiter.prune_joined()
            await asyncio.sleep(0)  # one step: a yield it scheduled would have taken the turn
            assert list(arbiter.held) == ["team/rl"]  # its pods may be among those unlisted
            listed.set()
            arbiter.prune_joined()  # what the coordinator does as the pods' watch shows it
            turn = await arbiter.acquire("team", "sft", "", timeout=5)
            assert sorted(turn.nodes) == ["n1", "n2"]
            check_no_overlap(nodes, "sft")
            assert list(arbiter.held) == ["team/sft"]
            await close(arbiter)

    run(body)


async def rl_behind_sft(arbiter: Arbiter) -> asyncio.Task[JobTurn]:
    """sft holds its turn on every node; rl asks for its own and waits behind it."""
    await arbiter.acquire("team", "sft", "", timeout=5)
    waiting = asyncio.create_task(arbiter.acquire("team", "rl", "", timeout=5))
    while "team/rl" not in {w.tenant_id for w in arbiter.table.waiters.values()}:
        await asyncio.sleep(0)  # bounded by `run`'s 30 s
    return waiting


def test_a_member_that_left_while_its_job_waited_is_not_prepared_and_the_rest_get_the_turn(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        async with cluster(tmp_path) as (nodes, view):
            arbiter = await leading(view)
            waiting = await rl_behind_sft(arbiter)
            # The job's sampler is deleted while it waits behind sft (its node's agent sees it go).
            del view.members["team/rl-sampler"]
            nodes[1].service.pod_gone("team/rl-sampler")
            await arbiter.yield_("team", "sft", "")
            turn = await waiting  # not TurnFailed "job team/rl has no pod with GPUs on node n2"
            assert sorted(turn.nodes) == ["n1"] and turn.pods == {"team/rl-trainer"}
            assert nodes[0].holders() == {"GPU-n1": "team/rl-trainer"}
            assert not nodes[1].holders()
            await arbiter.yield_("team", "rl", "")
            await close(arbiter)

    run(body)


def test_a_member_replaced_while_its_job_waited_is_prepared_in_its_place(tmp_path: Path) -> None:
    """The sampler's pod is replaced on the same GPU while the job waits (a Deployment's new
    pod): the turn is prepared with the new pod, not without it (its collectives would wait). A
    pod added meanwhile on a GPU another member holds, and one whose GPUs the coordinator does
    not know (a DRA node's), join no turn of this plan."""

    async def body() -> None:
        async with cluster(tmp_path) as (nodes, view):
            arbiter = await leading(view)
            waiting = await rl_behind_sft(arbiter)
            _, _, old = view.members.pop("team/rl-sampler")
            nodes[1].service.pod_gone("team/rl-sampler")
            new = nodes[1].add_pod("team/rl-sampler-2", nodes[1].gpus, "rl")
            member = dataclasses.replace(old, pod=new.tenant_id)
            view.members[new.tenant_id] = ("team", "rl", member)
            extra = dataclasses.replace(old, pod="team/rl-extra", node="n1", gpus=("GPU-n1",))
            view.members["team/rl-extra"] = ("team", "rl", extra)
            unknown = dataclasses.replace(old, pod="team/rl-dra", gpus=())
            view.members["team/rl-dra"] = ("team", "rl", unknown)
            await arbiter.yield_("team", "sft", "")
            turn = await waiting
            assert turn.pods == {"team/rl-trainer", "team/rl-sampler-2"}
            assert nodes[1].holders() == {"GPU-n2": "team/rl-sampler-2"}
            await arbiter.yield_("team", "rl", "")
            await close(arbiter)

    run(body)

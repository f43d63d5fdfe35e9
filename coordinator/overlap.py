"""A job that asks for its turn on a group while it holds, or waits for, its turn on another group
that shares GPUs with it (`coordinator.turns`).

llm-d's jobs hold several groups' turns at once (its slime integration takes the trainer group's
and then the sampler group's for a weight sync). Where the turn the job holds covers every pod
and GPU of the group it asks for, the job computes there already: that turn is the group's too,
granted at once, and it ends on its nodes when the last group held on it is yielded. Any other
overlap could only wait behind the job itself, so it is refused at once (FAILED_PRECONDITION),
as the node agent refuses a tenant that already holds or waits for one of its GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from agent.core.errors import AlreadyHolding
from coordinator.cluster import Plan
from coordinator.jobturn import JobTurn


def holding(
    plan: Plan, held: Mapping[str, JobTurn], asked: Iterable[Plan], share: bool = True
) -> JobTurn | None:
    """The turn that holds `plan` already: its own, or (where `share`) the job's turn on another
    group that covers it; None where no other turn of the job shares a GPU with it (it waits);
    else AlreadyHolding naming both groups and the GPUs they share."""
    if plan.key in held:
        return held[plan.key]
    wanted, pods = set(plan.resources), {p for each in plan.pods.values() for p in each}
    job, asking = f"{plan.namespace}/{plan.job}", _on(plan.group)
    for key, turn in sorted(held.items()):
        shared = wanted & set(turn.resources)
        mine = (turn.namespace, turn.job) == (plan.namespace, plan.job)
        if not mine or not shared:
            continue
        more = sorted(wanted - set(turn.resources)) or sorted(pods - turn.pods)
        if share and not more:
            return turn
        other = _on(key.partition("@")[2])
        needs = f", and needs more ({', '.join(more)})" if more else ""
        raise AlreadyHolding(
            f"job {job}: {asking} shares {', '.join(sorted(shared))} with {other}, which it "
            f"holds{needs}: yield {other} first"
        )
    for other_plan in asked:
        shared = wanted & set(other_plan.resources)
        mine = (other_plan.namespace, other_plan.job) == (plan.namespace, plan.job)
        if other_plan.key == plan.key or not mine or not shared:
            continue
        raise AlreadyHolding(
            f"job {job}: {asking} shares {', '.join(sorted(shared))} with "
            f"{_on(other_plan.group)}, which it already waits for: ask again once that turn "
            "is held or given up"
        )
    return None


def _on(group: str) -> str:
    return f"its turn on group {group!r}" if group else "its turn on all its members"

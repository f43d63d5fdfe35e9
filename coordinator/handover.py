"""A job turn's two phases on its member nodes, as the arbiter (`coordinator.turns`) hands a
turn over: every node prepares (makes room and restores), the first to fail ending the others'
preparations; a turn not decided is rolled back on every node of its plan, and a decided one is
committed on each. Which job's turn comes next, and what a decided turn holds, is the arbiter's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from baton._pb import jobturns_pb2 as jt
from coordinator.agents import AgentLinks, failure_text
from coordinator.cluster import Plan
from coordinator.releases import Releases, rolled_back

log = logging.getLogger(__name__)


async def prepare(
    links: AgentLinks, plan: Plan, epoch: int, turn_id: str, timeout_s: float
) -> tuple[dict[str, jt.NodeTurn] | None, list[tuple[str, BaseException]]]:
    """Prepare the turn `turn_id` of `plan` on each of its nodes: every node's answer where all
    prepared (else None), and the nodes that failed, each with why."""
    whose = (turn_id, plan.namespace, plan.job, plan.group)
    nodes = list(plan.pods)
    calls = {
        n: asyncio.ensure_future(
            links.prepare(n, plan.addresses[n], epoch, whose, plan.pods[n], timeout_s, nodes)
        )
        for n in nodes
    }
    try:  # the first node to fail fails the turn: the others are not waited for
        await asyncio.wait(calls.values(), return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for call in calls.values():
            call.cancel()  # a preparation still making room is given up on its node
    await asyncio.gather(*calls.values(), return_exceptions=True)
    failed = [
        (n, e) for n, c in calls.items() if not c.cancelled() and (e := c.exception()) is not None
    ]
    done = all(c.done() and not c.cancelled() and not c.exception() for c in calls.values())
    return ({n: c.result() for n, c in calls.items()} if done else None), failed


async def roll_back(
    releases: Releases,
    plan: Plan,
    epoch: int,
    turn_id: str,
    failed: list[tuple[str, BaseException]],
    wait_s: float,
) -> str:
    """Release the turn `turn_id` on every node of `plan` (one whose answer was lost may have
    prepared all the same), waiting up to `wait_s` for those that answered; the failed ones
    are not waited for, and their release is retried until they answer. Returns why the turn
    failed (`failed`, else the caller gave up) and which nodes are still to hear it."""
    why = failure_text(failed) if failed else "the caller gave up"
    broken = {n for n, _ in failed}
    late = await releases.release(
        dict(plan.addresses), epoch, turn_id, f"rolled back: {why}", wait_s,
        wait_for=[n for n in plan.addresses if n not in broken],
    )  # fmt: skip
    return f"{why}; {rolled_back(sorted(broken | set(late)))}"


async def commit(
    links: AgentLinks, plan: Plan, epoch: int, turn_id: str, held: Callable[[], bool]
) -> None:
    """Tell each node of `plan` that the turn `turn_id` is decided (which records it there); a
    commit that fails is logged, as a warning while the turn is `held()` (prepared, the node
    holds the turn anyway)."""
    nodes = list(plan.pods)
    commits = await asyncio.gather(
        *(links.commit(n, plan.addresses[n], epoch, turn_id) for n in nodes),
        return_exceptions=True,
    )
    for node, result in zip(nodes, commits, strict=True):
        if not isinstance(result, BaseException):
            continue
        if not held():  # it ended before its commit arrived
            log.debug("job %s: turn %s ended before its commit on %s", plan.key, turn_id, node)
        else:
            log.warning("job %s: commit on node %s failed: %s", plan.key, node, result)

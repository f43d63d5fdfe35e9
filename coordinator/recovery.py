"""What a new leader does before it serves: learn every agent's job turns and settle them.

Nothing of the turns is written to the Kubernetes API per turn: the agents hold them (on disk,
with the epoch that made each), so a new leader asks every agent (`Report`, which also raises
the agent's epoch, fencing the old leader off) and rebuilds its table from the answers. A turn
that every node it names reports was decided (its waiter may have been told): it is committed
where it was not yet, and held. A turn that a named node lacks was not decided, or was being
ended: it is released everywhere, and a job whose Acquire failed with the old leader asks again.
A node that does not answer is named in the log and counts as holding what it held.
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field

from agent.core.leases import Lease, LeaseTable
from baton._pb import jobturns_pb2 as jt
from coordinator.agents import AgentLinks, NodeFailed
from coordinator.cluster import ClusterView, PlanError, turn_key
from coordinator.jobturn import JobTurn

log = logging.getLogger(__name__)
COMMITTED = "committed"


@dataclass
class Recovered:
    """What a new leader found."""

    held: dict[str, JobTurn] = field(default_factory=dict)
    rolled_back: list[str] = field(default_factory=list)
    unreachable: dict[str, str] = field(default_factory=dict)
    """node → why it did not answer"""
    outranked: int = 0
    """The highest epoch an agent obeys, when above this leader's (nothing was settled then)."""


async def recover(view: ClusterView, links: AgentLinks, table: LeaseTable, epoch: int) -> Recovered:
    """Every reachable agent's job turns, settled into `table` and the returned holders."""
    addresses = view.addresses()
    nodes = sorted(addresses)
    answers = await asyncio.gather(
        *(links.report(n, addresses[n], epoch) for n in nodes), return_exceptions=True
    )
    found = Recovered()
    parts: dict[str, list[tuple[str, jt.NodeTurn]]] = {}
    for node, answer in zip(nodes, answers, strict=True):
        if isinstance(answer, BaseException):
            found.unreachable[node] = answer.why if isinstance(answer, NodeFailed) else str(answer)
            continue
        if answer.epoch > epoch:  # the Lease counts from below what the agents obey
            found.outranked = max(found.outranked, answer.epoch)
        for turn in answer.turns:
            parts.setdefault(turn.turn_id, []).append((node, turn))
    if found.outranked:
        return found
    for turn_id, where in sorted(parts.items()):
        await _settle(view, links, table, epoch, turn_id, where, addresses, found)
    if found.unreachable:
        log.warning(
            "epoch %d: agents not reached yet (their turns are settled when they answer): %s",
            epoch, "; ".join(f"{n}: {why}" for n, why in sorted(found.unreachable.items())),
        )  # fmt: skip
    return found


async def _settle(
    view: ClusterView,
    links: AgentLinks,
    table: LeaseTable,
    epoch: int,
    turn_id: str,
    where: list[tuple[str, jt.NodeTurn]],
    addresses: dict[str, str],
    found: Recovered,
) -> None:
    first = where[0][1]
    key = turn_key(first.namespace, first.job, first.group)
    nodes = {node: addresses[node] for node, _ in where}
    why = _undecided(where, found.unreachable, addresses)
    if not why and key in found.held:
        why = "its job holds another turn"
    if why:
        await _all(
            links.release(n, a, epoch, turn_id, f"rolled back by epoch {epoch}: {why}")
            for n, a in nodes.items()
        )
        found.rolled_back.append(f"{key} ({turn_id}): {why}")
        return
    await _all(
        links.commit(node, addresses[node], epoch, turn_id)
        for node, turn in where
        if turn.state != COMMITTED
    )
    try:  # the job's other nodes, if a node that had it did not answer: its release reaches them
        plan = view.plan(first.namespace, first.job, first.group)
        nodes = {**dict(plan.addresses), **nodes}
    except PlanError:
        pass
    resources = tuple(sorted({f"{node}/{gpu}" for node, t in where for gpu in t.gpus}))
    lease = Lease(
        lease_id=uuid.uuid4().hex[:16],
        tenant_id=key,
        gpus=resources,
        tokens={},
        granted_at=min(t.prepared_at for _, t in where),
        hold_until=math.inf,
    )
    table.restore_lease(lease)
    found.held[key] = JobTurn(
        key=key,
        turn_id=turn_id,
        lease_id=lease.lease_id,
        namespace=first.namespace,
        job=first.job,
        group=first.group,
        nodes=nodes,
        granted_at=lease.granted_at,
        restored=any(t.restored for _, t in where),
        resources=resources,
        joined={pod for _, t in where for pod in t.joined},
        pods=frozenset(pod for _, t in where for pod in t.members),
    )


def _undecided(
    where: list[tuple[str, jt.NodeTurn]], unreachable: dict[str, str], addresses: dict[str, str]
) -> str:
    """Why the turn was not decided, or "" if it was: every node it names reports it (or, for
    one that names none, a node reports it committed). A node that did not answer, or that the
    view has no agent address for, counts as having it: rolling back a turn its job was told it
    holds would let another job compute on its GPUs while it still does; holding one it was not
    told of only costs idle time."""
    named = set(where[0][1].nodes)
    if not named:
        return "" if any(t.state == COMMITTED for _, t in where) else "it was not committed"
    reported = {node for node, _ in where}
    lacking = sorted(named & set(addresses) - reported - set(unreachable))  # the rest: unknown
    if lacking:
        return (
            f"node {', '.join(lacking)} no longer has it (a yield or a roll-back was cut short, "
            "or it was never prepared there)"
        )
    return ""


async def _all(calls: Iterable[Awaitable[object]]) -> None:
    results = await asyncio.gather(*calls, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            log.warning("settling a job turn: %s", result)

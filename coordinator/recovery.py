"""What a new leader does before it serves: learn every agent's job turns and settle them.

Nothing of the turns is written to the Kubernetes API per turn: the agents hold them (on disk,
with the epoch that made each), so a new leader asks every agent (`Report`, which also raises
the agent's epoch, fencing the old leader off) and rebuilds its table from the answers. A turn
that every node it names reports was decided (its waiter may have been told): it is committed
where it was not yet, and held. A turn that a named node lacks was not decided, or was being
ended: it is released everywhere, and a job whose Acquire failed with the old leader asks again.
A node that does not answer (or misses a call that settles what it reported) counts as holding
what it held; while this replica leads it is asked again (`chase`, with backoff) until it
answers, as is, at once, each node whose agent the view lists only after recovery (its watch
listed late, or its address appeared later).
What such a node reports is settled by the same rules: its part of a turn held is added to it,
a turn this leader ended or rolled back is released there, and a turn only such nodes held is
judged as recovery would have.
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from agent.core.leases import Lease, LeaseTable
from agent.core.waiters import TenantUsage
from baton._pb import jobturns_pb2 as jt
from coordinator.agents import AgentLinks, NodeFailed
from coordinator.cluster import ClusterView, PlanError, turn_key
from coordinator.jobturn import JobTurn
from coordinator.releases import FIRST_BACKOFF_S, MAX_BACKOFF_S
from coordinator.settling import LATE
from coordinator.turns import Arbiter

log = logging.getLogger(__name__)
COMMITTED = "committed"


@dataclass
class Recovered:
    """What a new leader found (and, while it chases the agents it missed, finds)."""

    held: dict[str, JobTurn] = field(default_factory=dict)
    """The job turns held: once the replica leads, the arbiter's own."""
    rolled_back: list[str] = field(default_factory=list)
    unreachable: dict[str, str] = field(default_factory=dict)
    """node → why it did not answer"""
    outranked: int = 0
    """The highest epoch an agent obeys, when above this leader's or this one from another
    leader (`obeys_another`; nothing was settled then)."""
    answered: set[str] = field(default_factory=set)
    """The nodes that reported to this leader (a turn they did not report, they lack)."""
    judged: set[str] = field(default_factory=set)
    """The older leaders' turns this leader held or rolled back (by turn id)."""


async def recover(view: ClusterView, links: AgentLinks, table: LeaseTable, epoch: int) -> Recovered:
    """Every reachable agent's job turns, settled into `table` and the returned holders."""
    addresses = view.addresses()
    nodes = sorted(addresses)

    async def report(node: str) -> jt.ReportResponse:
        answer = await links.report(node, addresses[node], epoch)
        on_our_clock(answer, table.now())  # as it came: a slower node's wait is not its age
        return answer

    answers = await asyncio.gather(*(report(n) for n in nodes), return_exceptions=True)
    found = Recovered()
    parts: dict[str, list[tuple[str, jt.NodeTurn]]] = {}
    for node, answer in zip(nodes, answers, strict=True):
        if isinstance(answer, BaseException):
            found.unreachable[node] = answer.why if isinstance(answer, NodeFailed) else str(answer)
            continue
        found.answered.add(node)
        if obeys_another(answer, epoch, links.holder):  # the Lease was created again
            found.outranked = max(found.outranked, answer.epoch)
        for turn in answer.turns:
            parts.setdefault(turn.turn_id, []).append((node, turn))
    if found.outranked:
        return found
    for _, where in sorted(parts.items()):
        missed, what = await _settle(view, links, table, epoch, where, addresses, found)
        for node in missed:  # it may hold what was settled otherwise: asked again (`chase`)
            found.answered.discard(node)
            found.unreachable[node] = f"it answered, but settling its job turns failed ({what})"
    if found.unreachable:
        log.warning(
            "epoch %d: agents not reached yet (asked again until they answer; their turns are "
            "settled then): %s",
            epoch, "; ".join(f"{n}: {why}" for n, why in sorted(found.unreachable.items())),
        )  # fmt: skip
    return found


def on_our_clock(answer: jt.ReportResponse, now: float) -> None:
    """Move the reported turns' times onto this leader's clock (reading `now`): each as long ago
    as the agent's clock says. Its clock and ours may disagree (another machine's, or one that a
    step of the wall clock has moved since either started); an older agent tells no time."""
    if answer.now <= 0:
        return
    for turn in answer.turns:
        turn.prepared_at = now - max(0.0, answer.now - turn.prepared_at)
        if turn.committed_at:
            turn.committed_at = now - max(0.0, answer.now - turn.committed_at)


def obeys_another(answer: jt.ReportResponse, epoch: int, holder: str) -> bool:
    """Whether the agent that gave `answer` obeys another leader than `holder` leading in
    `epoch`: a higher epoch, or this one from another holder (a Lease created again counts from
    1 again); an agent or leader that names none (an older version) is taken as this one's."""
    other = bool(answer.holder) and bool(holder) and answer.holder != holder
    return answer.epoch > epoch or (answer.epoch == epoch and other)


async def chase(
    arbiter: Arbiter,
    found: Recovered,
    epoch: int,
    appeared: asyncio.Event | None = None,
    outranked: Callable[[int], object] | None = None,
) -> None:
    """Ask each agent that recovery did not reach again, with backoff, until it answers (what it
    reports is then settled as recovery would have), leaves the cluster or obeys a newer epoch;
    `arbiter.settling.unsettled` names those still waited for. With `appeared` (set when an agent's
    address appears in the view), each node listed later that this leader has neither heard
    nor is asking is asked too, at once, and chased the same way: then it runs until cancelled
    (when this replica stops leading). A node that obeys a newer epoch stays unsettled (saying
    so, and asked no more this term) and `outranked(its epoch)` is called: this replica must not
    lead below it (the Lease was recreated, or a newer leader leads)."""
    one_at_a_time = asyncio.Lock()  # two nodes of one turn may answer together
    asking: set[str] = set()
    obeying: set[str] = set()  # the nodes that obey another leader
    async with asyncio.TaskGroup() as chasing:

        def ask(node: str, first_wait: float) -> None:
            asking.add(node)
            task = chasing.create_task(
                _chase(arbiter, found, epoch, node, one_at_a_time, first_wait, outranked)
            )

            def done(finished: asyncio.Task[bool]) -> None:
                asking.discard(node)
                if not finished.cancelled() and not finished.exception() and finished.result():
                    obeying.add(node)

            task.add_done_callback(done)

        for node in sorted(found.unreachable):
            ask(node, FIRST_BACKOFF_S)  # it did not answer just now: give it time to come back
        while appeared is not None:
            appeared.clear()
            listed = arbiter.view.addresses().keys()
            # (heard, not `found.answered`: a node deleted and listed again is asked again)
            for node in sorted(listed - arbiter.settling.heard - asking - obeying):
                arbiter.settling.unsettled[node] = LATE
                ask(node, 0.0)
            await appeared.wait()


async def _chase(
    arbiter: Arbiter,
    found: Recovered,
    epoch: int,
    node: str,
    one_at_a_time: asyncio.Lock,
    first_wait: float,
    outranked: Callable[[int], object] | None = None,
) -> bool:
    """Whether the node obeys another leader (else it answered, or it left the cluster)."""
    wait, tries = first_wait, 0
    while (address := arbiter.view.addresses().get(node)) is not None:
        await asyncio.sleep(wait)
        wait, tries = min(max(wait * 2, FIRST_BACKOFF_S), MAX_BACKOFF_S), tries + 1
        try:
            answer = await arbiter.links.report(node, address, epoch)
        except NodeFailed as err:
            arbiter.settling.unsettled[node] = err.why
            log.log(
                logging.WARNING if tries % 20 == 0 else logging.DEBUG,
                "epoch %d: node %s has not answered yet (%s): its job turns are unsettled",
                epoch, node, err.why,
            )  # fmt: skip
            continue
        if obeys_another(answer, epoch, arbiter.links.holder):  # (the Lease recreated)
            arbiter.settling.unsettled[node] = (
                f"its agent obeys epoch {answer.epoch} ({answer.holder or 'its leader unnamed'}), "
                f"not this leader's {epoch} (the Lease was recreated, or a newer leader leads): "
                "this replica steps down"
            )
            log.warning(
                "node %s obeys epoch %d (%s), not this leader's %d: stepping down (the Lease is "
                "taken again above it unless a newer leader holds it)",
                node, answer.epoch, answer.holder or "its leader unnamed", epoch,
            )  # fmt: skip
            if outranked is not None:
                outranked(answer.epoch)
            return True
        on_our_clock(answer, arbiter.table.now())
        async with one_at_a_time:
            settled, outcomes = await _settle_report(arbiter, found, epoch, node, address, answer)
        if settled:
            log.info(
                "epoch %d: node %s answered (after %d tries): %s", epoch, node, tries,
                "; ".join(outcomes) or "no job turn of an older leader",
            )  # fmt: skip
            arbiter.settling.settled(node)
            return False
        why = "it answered, but settling its job turns failed: asked again"
        arbiter.settling.unsettled[node] = why
    else:  # the node left the cluster
        log.info("node %s left the cluster before it answered epoch %d", node, epoch)
    arbiter.settling.settled(node, heard=False)
    return False


async def _settle_report(
    arbiter: Arbiter,
    found: Recovered,
    epoch: int,
    node: str,
    address: str,
    answer: jt.ReportResponse,
) -> tuple[bool, list[str]]:
    """Settle what a node reported late; whether every call it needed was answered."""
    found.answered.add(node)
    settled, outcomes = True, list[str]()
    for turn in answer.turns:
        if turn.epoch >= epoch:  # this leader's own
            continue
        where, view, links = [(node, turn)], arbiter.view, arbiter.links
        missed, what = await _settle(
            view, links, arbiter.table, epoch, where, {node: address}, found
        )
        settled = settled and not missed
        outcomes.append(what)
    return settled, outcomes


async def _settle(
    view: ClusterView,
    links: AgentLinks,
    table: LeaseTable,
    epoch: int,
    where: list[tuple[str, jt.NodeTurn]],
    addresses: dict[str, str],
    found: Recovered,
) -> tuple[list[str], str]:
    """Settle one turn as the nodes of `where` report it; the nodes that did not answer a call
    it needed, and what became of it."""
    first = where[0][1]
    turn_id, key = first.turn_id, turn_key(first.namespace, first.job, first.group)
    nodes = {node: addresses[node] for node, _ in where}
    resources = tuple(sorted({f"{node}/{gpu}" for node, t in where for gpu in t.gpus}))
    holding = next((t for t in found.held.values() if t.turn_id == turn_id), None)
    if holding is not None:  # a node's part of a held turn, reported late
        why = _taken(table, resources, holding.lease_id)
    elif turn_id in found.judged:
        why = "this leader ended it"
    else:
        why = _undecided(where, found.answered) or _claimed(table, key, resources, found)
    found.judged.add(turn_id)
    what = f"turn {turn_id} of job {key}"
    if why:
        found.rolled_back.append(f"{key} ({turn_id}): {why}")
        missed = await _missed(
            {
                n: links.release(n, a, epoch, turn_id, f"rolled back by epoch {epoch}: {why}")
                for n, a in nodes.items()
            }
        )
        return missed, f"{what} rolled back ({why})"
    if holding is not None:
        _add(table, holding, where, nodes, resources)
    else:
        _hold(view, table, key, where, nodes, resources, found)
    missed = await _missed(
        {
            node: links.commit(node, addresses[node], epoch, turn_id)
            for node, turn in where
            if turn.state != COMMITTED
        }
    )
    return missed, f"{what} held" + (f" on {', '.join(sorted(nodes))} too" if holding else "")


def _hold(
    view: ClusterView,
    table: LeaseTable,
    key: str,
    where: list[tuple[str, jt.NodeTurn]],
    nodes: dict[str, str],
    resources: tuple[str, ...],
    found: Recovered,
) -> None:
    first = where[0][1]
    try:  # the job's other nodes, if a node that had it did not answer: its release reaches them
        plan = view.plan(first.namespace, first.job, first.group)
        nodes = {**dict(plan.addresses), **nodes}
        # The fair policy charges the turn at its end by the job's duty and tier, as enqueue
        # set them for the old leader.
        table.usage[key] = TenantUsage(duty=plan.duty, tier=plan.tier)
    except PlanError:
        pass
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
        turn_id=first.turn_id,
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


def _add(
    table: LeaseTable,
    turn: JobTurn,
    where: list[tuple[str, jt.NodeTurn]],
    nodes: dict[str, str],
    resources: tuple[str, ...],
) -> None:
    """A node's part, reported late, added to the held turn (its GPUs to the turn's lease)."""
    turn.resources = tuple(sorted({*turn.resources, *resources}))
    table.restore_lease(replace(table.leases[turn.lease_id], gpus=turn.resources))
    turn.nodes.update(nodes)
    turn.restored = turn.restored or any(t.restored for _, t in where)
    turn.joined |= {pod for _, t in where for pod in t.joined}
    turn.pods = turn.pods | {pod for _, t in where for pod in t.members}


def _undecided(where: list[tuple[str, jt.NodeTurn]], answered: set[str]) -> str:
    """Why the turn was not decided, or "" if it was: every node it names reports it (or, for
    one that names none, a node reports it committed). A node that has not answered this
    leader (or that the view has no agent address for) counts as having it: rolling back a turn
    its job was told it holds would let another job compute on its GPUs while it still does;
    holding one it was not told of only costs idle time."""
    named = set(where[0][1].nodes)
    if not named:
        return "" if any(t.state == COMMITTED for _, t in where) else "it was not committed"
    reported = {node for node, _ in where}
    lacking = sorted(named & answered - reported)  # the rest: unknown
    if lacking:
        return (
            f"node {', '.join(lacking)} no longer has it (a yield or a roll-back was cut short, "
            "or it was never prepared there)"
        )
    return ""


def _claimed(table: LeaseTable, key: str, resources: tuple[str, ...], found: Recovered) -> str:
    """Why a decided turn cannot be held now, or "": its job holds or asks for another turn, or
    the table gives its GPUs to another job (while its node did not answer)."""
    if key in found.held:
        return "its job holds another turn"
    if any(w.tenant_id == key for w in table.waiters.values()):
        return "its job asks for a new turn"
    return _taken(table, resources, "")


def _taken(table: LeaseTable, resources: tuple[str, ...], own: str) -> str:
    """Which of `resources` the table gives to another lease or reservation than `own`, or ""."""
    for resource in resources:
        state = table.gpus.get(resource)
        if state is None or state.holder is None or state.holder == own:
            continue
        other = table.leases.get(state.holder) or table.waiters.get(state.holder)
        whose = f"job {other.tenant_id}" if other is not None else "another job"
        return f"its GPU {resource} is {whose}'s now"
    return ""


async def _missed(calls: dict[str, Awaitable[object]]) -> list[str]:
    """The nodes whose call was not answered (each failure logged)."""
    results = await asyncio.gather(*calls.values(), return_exceptions=True)
    missed = []
    for node, result in zip(calls, results, strict=True):
        if isinstance(result, BaseException):
            log.warning("settling a job turn on node %s: %s", node, result)
            missed.append(node)
    return missed

"""The phases of `baton bench gang` (`commands.bench.gang` runs them and reports the figures).

Job turns through the coordinator's arbiter (`leading`, `take_turns`), each turn's spread over
its nodes from the agents' Commit answers (`skews`), the node-local reference turns on one
agent (`reference`), the phase whose handoffs park (`efficiency`) and the two jobs that cross on
two nodes (`crossed`); what they measured accumulates in `Figures`.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Any

from agent.core.leases import LeaseTable
from baton._pb import jobturns_pb2 as jt
from commands.bench.gang_nodes import GPU_MIB, NAMESPACE, GangCluster, GangNode
from commands.bench.handoff import handoffs
from coordinator.agents import AgentLinks
from coordinator.cluster import ClusterView
from coordinator.recovery import recover
from coordinator.turns import Arbiter, TurnFailed

HANDOFF_HOLD_MS = 2.0
"""The hold of the handoff phase and its reference (as `bench handoff`'s default)."""
MEMBER_MIB = GPU_MIB * 6 // 10
"""A member's memory in the efficiency phase: no two jobs' fit on a GPU."""
ACQUIRE_TIMEOUT_S = 10.0
MAX_MISSES = 3
"""A crossing job stops after this many acquires that timed out or failed."""
EPOCH = 1


@dataclass
class Turn:
    """One job turn as the job saw it, and its turn id (the agents' name for it)."""

    job: str
    requested: float
    granted: float
    turn_id: str
    yielded: float = 0.0


class RecordingLinks(AgentLinks):
    """The coordinator's calls to the agents, keeping each node's Commit answer per turn."""

    def __init__(self, token: str) -> None:
        super().__init__(token)
        self.commits: dict[str, dict[str, jt.NodeTurn]] = {}

    async def commit(self, node: str, address: str, epoch: int, turn_id: str) -> jt.NodeTurn:
        answer = await super().commit(node, address, epoch, turn_id)
        self.commits.setdefault(turn_id, {})[node] = answer
        return answer


@dataclass
class Figures:
    """What the phases measured."""

    handoffs: list[float] = field(default_factory=list)
    reference: list[float] = field(default_factory=list)
    skews: list[float] = field(default_factory=list)
    prepare_skews: list[float] = field(default_factory=list)
    parked_handoffs: list[float] = field(default_factory=list)
    efficiency: float = 0.0
    reference_efficiency: float = 0.0
    """The node-local turns of the efficiency phase: the same parks and holds on one agent."""
    reference_parked_handoffs: list[float] = field(default_factory=list)
    moves: dict[str, float] = field(default_factory=dict)
    crossed_turns: int = 0
    deadlocks: int = 0
    crossed_timeouts: int = 0
    crossed_failures: int = 0


async def leading(view: ClusterView, links: AgentLinks) -> Arbiter:
    """An arbiter leading from `EPOCH`, its table the coordinator's (fifo, no maximum hold)."""

    def new_table() -> LeaseTable:
        return LeaseTable(clock=time.time, max_hold=math.inf)

    arbiter = Arbiter(view, links, new_table, time.time)
    table = arbiter.new_table()
    held = await recover(view, links, table, EPOCH)
    arbiter.lead(EPOCH, table, held)
    return arbiter


async def take_turns(
    arbiter: Arbiter, jobs: list[str], each: int, hold_ms: float, first: Any = None
) -> list[Turn]:
    """Every job takes `each` turns (after one warm-up turn) holding `hold_ms`; `first(job)`,
    if given, runs in each job's warm-up turn. The measured turns, in grant order."""
    turns: list[Turn] = []

    async def loop(job: str) -> None:
        for i in range(each + 1):
            requested = time.perf_counter()
            turn = await arbiter.acquire(NAMESPACE, job, "", ACQUIRE_TIMEOUT_S)
            record = Turn(job, requested, time.perf_counter(), turn.turn_id)
            if i == 0 and first is not None:
                await first(job)
            await asyncio.sleep(hold_ms / 1000)  # the job computes
            record.yielded = time.perf_counter()
            if i > 0:
                turns.append(record)
            await arbiter.yield_(NAMESPACE, job, "")

    await asyncio.gather(*(loop(job) for job in jobs))
    return sorted(turns, key=lambda t: t.granted)


def turn_records(turns: list[Turn]) -> list[list[Any]]:
    """`bench handoff`'s turn records, the grant order standing for the fencing token."""
    return [[i, t.job, t.requested, t.granted, t.yielded] for i, t in enumerate(turns)]


def skews(turns: list[Turn], links: RecordingLinks, found: Figures) -> None:
    for turn in turns:
        nodes = list(links.commits.pop(turn.turn_id, {}).values())
        if len(nodes) < 2:
            continue
        committed = [n.committed_at for n in nodes]
        prepared = [n.prepared_at for n in nodes]
        found.skews.append(max(committed) - min(committed))
        found.prepare_skews.append(max(prepared) - min(prepared))


async def reference(
    node: GangNode, each: int, hold_ms: float = HANDOFF_HOLD_MS, mib: int = 0
) -> list[list[Any]]:
    """Node-local turns on `node`'s agent: two local tenants of its GPU taking turns, as
    `bench handoff` records them. With `mib`, each takes that much of the GPU in its first turn
    (so every handoff parks one and restores the other)."""
    from agent.client import AsyncBaton
    from agent.parking.fakegpu import FakeGpuMemory

    names = [f"bench-local-{c}{'-parked' if mib else ''}" for c in "ab"]
    tenants = [AsyncBaton(node.socket, [node.gpu], name=n, gpu_memory_mib=mib) for n in names]
    records: list[list[Any]] = []

    async def loop(baton: AsyncBaton) -> None:
        for i in range(each + 1):
            requested = time.perf_counter()
            lease = await asyncio.wait_for(baton.acquire(), ACQUIRE_TIMEOUT_S)
            granted = time.perf_counter()
            if i == 0 and mib:
                memory = FakeGpuMemory(str(baton.name), node.fake_dir)
                await asyncio.to_thread(memory.allocate, node.gpu, mib)
            await asyncio.sleep(hold_ms / 1000)  # the tenant computes
            yielded = time.perf_counter()
            if i > 0:
                token = lease.fencing_tokens[node.gpu]
                records.append([token, baton.name, requested, granted, yielded])
            await baton.yield_()

    try:
        for baton in tenants:
            await asyncio.wait_for(baton.connect(), ACQUIRE_TIMEOUT_S)
        await asyncio.gather(*(loop(b) for b in tenants))
    finally:
        for baton in tenants:
            await baton.close()
    return records


def _busy_share(records: list[list[Any]]) -> float:
    """Time held over the wall time of turn records (`bench handoff`'s): 1.0 is no idle."""
    busy = sum(yielded - granted for *_, granted, yielded in records)
    wall = max(r[4] for r in records) - min(r[3] for r in records)
    return busy / wall if wall > 0 else 0.0


async def efficiency(
    cluster: GangCluster,
    arbiter: Arbiter,
    jobs: dict[str, dict[str, str]],
    each: int,
    hold_ms: float,
    links: RecordingLinks,
    found: Figures,
) -> None:
    """Parks forced: each member takes `MEMBER_MIB` in its job's warm-up turn; then every job
    takes `each` turns holding `hold_ms`, and so do two node-local tenants for the reference."""
    from agent.parking.fakegpu import FakeGpuMemory

    nodes = {n.name: n for n in cluster.nodes}

    def allocate(job: str) -> None:
        for node_name, pod in jobs[job].items():
            node = nodes[node_name]
            FakeGpuMemory(pod, node.fake_dir).allocate(node.gpu, MEMBER_MIB)

    async def first(job: str) -> None:
        await asyncio.to_thread(allocate, job)

    before = await asyncio.to_thread(_moves, cluster.nodes)
    # The warm-up turns allocate; the jobs' next turns park and restore for the first time.
    warm = await take_turns(arbiter, list(jobs), 1, hold_ms, first)
    skews(warm, links, Figures())
    turns = await take_turns(arbiter, list(jobs), each, hold_ms)
    after = await asyncio.to_thread(_moves, cluster.nodes)
    found.moves = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in ("park", "restore")}
    if not found.moves["park"]:
        raise RuntimeError("the efficiency phase parked nothing: parks were not forced")
    records = turn_records(turns)
    found.efficiency = _busy_share(records)
    found.parked_handoffs = handoffs(records)
    skews(turns, links, found)
    # The same parks and holds between two node-local tenants of one of those agents.
    local = await reference(cluster.nodes[0], each, hold_ms, MEMBER_MIB)
    found.reference_efficiency = _busy_share(local)
    found.reference_parked_handoffs = handoffs(local)


def _moves(nodes: list[GangNode]) -> dict[str, float]:
    total: dict[str, float] = {}
    for node in nodes:
        for direction, count in node.moves().items():
            total[direction] = total.get(direction, 0.0) + count
    return total


async def crossed(arbiter: Arbiter, jobs: list[str], turns: int, found: Figures) -> None:
    """Two jobs on the same two nodes asking again the moment they yield, `turns` in all,
    bounded."""
    resources = arbiter.view.plan(NAMESPACE, jobs[0]).resources
    shares = [turns - turns // 2, turns // 2]

    async def loop(job: str, share: int) -> None:
        done = misses = 0
        while done < share and misses < MAX_MISSES:
            try:
                await arbiter.acquire(NAMESPACE, job, "", ACQUIRE_TIMEOUT_S)
            except TimeoutError:
                misses += 1
                found.crossed_timeouts += 1
                if arbiter.holder_of(resources) is None:
                    found.deadlocks += 1
                continue
            except TurnFailed:
                misses += 1
                found.crossed_failures += 1
                continue
            done += 1
            found.crossed_turns += 1
            await arbiter.yield_(NAMESPACE, job, "")

    await asyncio.gather(*(loop(job, share) for job, share in zip(jobs, shares, strict=True)))

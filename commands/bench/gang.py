"""`baton bench gang`: one turn for a whole job across 2 to 8 nodes, through the coordinator.

The cluster is real but for the kubelet (`commands.bench.gang_nodes`): a kube-apiserver and
etcd, one `baton agent` process per node with the fake backend on a simulated GPU of its own,
and job pods (one per node) bound through the API. The coordinator's arbiter runs in this
process over a cluster view fed by its own watches, and calls the agents over gRPC. All times
are this process's `perf_counter`, but the skew, which the agents' own clock gives. Phases:

- handoff: the jobs take turns on the same N nodes, each holding `HANDOFF_HOLD_MS`, their
  memory fitting beside each other; a handoff is a job's yield call → the waiting job's acquire
  returning, every member node committed. In the same rounds, taking turns with it, the
  reference: two node-local tenants on the first node's agent (the real client, in this
  process), yield call → grant, as `bench handoff` measures it.
- skew: per job turn (handoff and efficiency phases), the spread of the nodes' `committed_at`
  (the turn starting on each node; `prepare_skew_*` the spread of `prepared_at`, the member's
  grant on the node), from the agents' Commit answers.
- efficiency: jobs whose pods ask for `MEMBER_MIB` of their GPU (`baton.dev/gpu-memory`) and
  take it in their first turn, so no two jobs fit and every handoff parks the leaver and
  restores the next on every node; they hold `hold_ms` in turn: held / wall time, ideal 1.0;
  the agents' move counters show the parks (`parks`, `restores`). The reference
  (`reference_efficiency`, `reference_parked_handoff_*`): two node-local tenants of the first
  node's agent with the same memory and hold, so each of their handoffs parks on one node.
- crossed: two more jobs on the first two nodes ask again the moment they yield, every acquire
  bounded by `ACQUIRE_TIMEOUT_S`; a deadlock is an acquire that timed out while no job held the
  turn. `crossed_turns` counts the turns completed.
"""

from __future__ import annotations

import asyncio
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.core.leases import LeaseTable
from baton._pb import jobturns_pb2 as jt
from commands.bench.gang_nodes import GPU_MIB, NAMESPACE, TOKEN, GangCluster, GangNode
from commands.bench.handoff import handoffs, percentile
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
CROSS_NODES = 2
TARGETS = {"handoff_over_reference_ms": 5.0, "skew_ms": 2.0, "efficiency": 0.95}
"""The issue's targets: reported against, never enforced."""


@dataclass
class GangSetup:
    """One run's size."""

    nodes: int = 4
    jobs: int = 2
    turns: int = 200
    """Turns of each measured phase (handoff, its reference, efficiency), all jobs together."""
    hold_ms: float = 50.0
    """Each job's hold in the efficiency phase."""
    crossed: int = 1000
    rounds: int = 3
    """The handoff phase and its reference take turns for this many rounds."""

    def check(self) -> None:
        """Refuse what cannot run, naming the option."""
        if not 2 <= self.nodes <= 8:
            raise ValueError(f"nodes {self.nodes}: a gang spans 2 to 8 nodes")
        if self.jobs < 2:
            raise ValueError(f"jobs {self.jobs}: a handoff needs 2 or more")
        if self.turns < 2 * self.jobs:
            raise ValueError(f"turns {self.turns}: at least 2 per job")
        if self.hold_ms <= 0:
            raise ValueError(f"hold-ms {self.hold_ms:g} must be above 0")
        if self.crossed < 2:
            raise ValueError(f"crossed {self.crossed}: at least 2 (one turn per crossing job)")


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


def run_gang_bench(setup: GangSetup) -> dict[str, Any]:
    """Run every phase on one cluster; returns the bench's JSON fields."""
    setup.check()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="baton-gang-") as workdir:
        cluster = GangCluster(Path(workdir), setup.nodes)
        with cluster.running():
            jobs = {
                f"job-{i}": cluster.add_job(f"job-{i}", cluster.nodes) for i in range(setup.jobs)
            }
            parking = {
                f"parked-{i}": cluster.add_job(f"parked-{i}", cluster.nodes, MEMBER_MIB)
                for i in range(setup.jobs)
            }
            crossing = cluster.nodes[:CROSS_NODES]
            cross = {f"cross-{c}": cluster.add_job(f"cross-{c}", crossing) for c in "ab"}
            cluster.wait_known({**jobs, **parking, **cross})
            found = asyncio.run(_phases(setup, cluster, jobs, parking, list(cross)))
    return _report(setup, found, load)


async def _phases(
    setup: GangSetup,
    cluster: GangCluster,
    jobs: dict[str, dict[str, str]],
    parking: dict[str, dict[str, str]],
    cross: list[str],
) -> Figures:
    links = RecordingLinks(TOKEN)
    arbiter = await _leading(cluster.view, links)
    found = Figures()
    try:
        each = max(2, setup.turns // (setup.jobs * setup.rounds))
        for _ in range(setup.rounds):
            turns = await _take_turns(arbiter, list(jobs), each, HANDOFF_HOLD_MS)
            found.handoffs += handoffs(_records(turns))
            _skews(turns, links, found)
            found.reference += handoffs(await _reference(cluster.nodes[0], each))
        await _efficiency(setup, cluster, arbiter, parking, links, found)
        await _crossed(setup, arbiter, cross, found)
    finally:
        await arbiter.close()
        await links.close()
    return found


async def _leading(view: ClusterView, links: AgentLinks) -> Arbiter:
    """An arbiter leading from `EPOCH`, its table the coordinator's (fifo, no maximum hold)."""

    def new_table() -> LeaseTable:
        return LeaseTable(clock=time.time, max_hold=math.inf)

    arbiter = Arbiter(view, links, new_table, time.time)
    table = arbiter.new_table()
    held = await recover(view, links, table, EPOCH)
    arbiter.lead(EPOCH, table, held)
    return arbiter


async def _take_turns(
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


def _records(turns: list[Turn]) -> list[list[Any]]:
    """`bench handoff`'s turn records, the grant order standing for the fencing token."""
    return [[i, t.job, t.requested, t.granted, t.yielded] for i, t in enumerate(turns)]


def _skews(turns: list[Turn], links: RecordingLinks, found: Figures) -> None:
    for turn in turns:
        nodes = list(links.commits.pop(turn.turn_id, {}).values())
        if len(nodes) < 2:
            continue
        committed = [n.committed_at for n in nodes]
        prepared = [n.prepared_at for n in nodes]
        found.skews.append(max(committed) - min(committed))
        found.prepare_skews.append(max(prepared) - min(prepared))


async def _reference(
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


async def _efficiency(
    setup: GangSetup,
    cluster: GangCluster,
    arbiter: Arbiter,
    jobs: dict[str, dict[str, str]],
    links: RecordingLinks,
    found: Figures,
) -> None:
    """Parks forced: each member takes `MEMBER_MIB` in its job's warm-up turn."""
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
    warm = await _take_turns(arbiter, list(jobs), 1, setup.hold_ms, first)
    _skews(warm, links, Figures())
    each = max(1, setup.turns // setup.jobs)
    turns = await _take_turns(arbiter, list(jobs), each, setup.hold_ms)
    after = await asyncio.to_thread(_moves, cluster.nodes)
    found.moves = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in ("park", "restore")}
    if not found.moves["park"]:
        raise RuntimeError("the efficiency phase parked nothing: parks were not forced")
    records = _records(turns)
    found.efficiency = _busy_share(records)
    found.parked_handoffs = handoffs(records)
    _skews(turns, links, found)
    # The same parks and holds between two node-local tenants of one of those agents.
    local = await _reference(cluster.nodes[0], each, setup.hold_ms, MEMBER_MIB)
    found.reference_efficiency = _busy_share(local)
    found.reference_parked_handoffs = handoffs(local)


def _moves(nodes: list[GangNode]) -> dict[str, float]:
    total: dict[str, float] = {}
    for node in nodes:
        for direction, count in node.moves().items():
            total[direction] = total.get(direction, 0.0) + count
    return total


async def _crossed(setup: GangSetup, arbiter: Arbiter, jobs: list[str], found: Figures) -> None:
    """Two jobs on the same two nodes asking again the moment they yield, bounded."""
    resources = arbiter.view.plan(NAMESPACE, jobs[0]).resources
    shares = [setup.crossed - setup.crossed // 2, setup.crossed // 2]

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


def _report(setup: GangSetup, found: Figures, load: float) -> dict[str, Any]:
    if not found.handoffs or not found.reference:
        raise RuntimeError("no handoffs observed; the jobs never waited for each other")

    def ms(samples: list[float], q: float) -> float:
        return round(percentile(samples or [math.nan], q) * 1000, 3)

    handoff_p99, reference_p99 = ms(found.handoffs, 0.99), ms(found.reference, 0.99)
    skew_p99 = ms(found.skews, 0.99)
    return {
        "jobs": setup.jobs,
        "nodes": setup.nodes,
        "turns": setup.turns,
        "hold_ms": setup.hold_ms,
        "handoff_hold_ms": HANDOFF_HOLD_MS,
        "handoff_p50_ms": ms(found.handoffs, 0.5),
        "handoff_p99_ms": handoff_p99,
        "handoff_samples": len(found.handoffs),
        "reference_handoff_p50_ms": ms(found.reference, 0.5),
        "reference_handoff_p99_ms": reference_p99,
        "reference_samples": len(found.reference),
        "handoff_over_reference_p99_ms": round(handoff_p99 - reference_p99, 3),
        "skew_p50_ms": ms(found.skews, 0.5),
        "skew_p99_ms": skew_p99,
        "prepare_skew_p50_ms": ms(found.prepare_skews, 0.5),
        "prepare_skew_p99_ms": ms(found.prepare_skews, 0.99),
        "skew_samples": len(found.skews),
        "efficiency": round(found.efficiency, 4),
        "ideal_efficiency": 1.0,
        "reference_efficiency": round(found.reference_efficiency, 4),
        "parked_handoff_p50_ms": ms(found.parked_handoffs, 0.5),
        "parked_handoff_p99_ms": ms(found.parked_handoffs, 0.99),
        "reference_parked_handoff_p50_ms": ms(found.reference_parked_handoffs, 0.5),
        "reference_parked_handoff_p99_ms": ms(found.reference_parked_handoffs, 0.99),
        "parks": int(found.moves.get("park", 0)),
        "restores": int(found.moves.get("restore", 0)),
        "crossed": setup.crossed,
        "crossed_turns": found.crossed_turns,
        "deadlocks": found.deadlocks,
        "crossed_timeouts": found.crossed_timeouts,
        "crossed_failures": found.crossed_failures,
        "rounds": setup.rounds,
        "load_1m": round(load, 2),
        "meets_handoff_target": handoff_p99 <= reference_p99 + TARGETS["handoff_over_reference_ms"],
        "meets_skew_target": skew_p99 <= TARGETS["skew_ms"],
        "meets_efficiency_target": found.efficiency >= TARGETS["efficiency"],
        "meets_deadlock_target": found.deadlocks == 0 and found.crossed_turns == setup.crossed,
    }

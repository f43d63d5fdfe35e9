"""`baton bench gang`: one turn for a whole job across 2 to 8 nodes, through the coordinator.

The cluster is real but for the kubelet (`commands.bench.gang_nodes`): a kube-apiserver and
etcd, one `baton agent` process per node with the fake backend on a simulated GPU of its own,
and job pods (one per node) bound through the API. The coordinator's arbiter runs in this
process over a cluster view fed by its own watches, and calls the agents over gRPC. All times
are this process's `perf_counter`, but the skew, which the agents' own clock gives. The phases
(`commands.bench.gang_phases`):

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commands.bench.gang_nodes import TOKEN, GangCluster
from commands.bench.gang_phases import (
    HANDOFF_HOLD_MS,
    MEMBER_MIB,
    Figures,
    RecordingLinks,
    crossed,
    efficiency,
    leading,
    reference,
    skews,
    take_turns,
    turn_records,
)
from commands.bench.handoff import handoffs, percentile

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
    pin: bool = True
    """Each node's agent on one CPU of this machine (`GangCluster`)."""

    def check(self) -> None:
        """Refuse what cannot run, naming the option."""
        if not 2 <= self.nodes <= 8:
            raise ValueError(f"nodes {self.nodes}: a gang spans 2 to 8 nodes")
        if self.jobs < 2:
            raise ValueError(f"jobs {self.jobs}: a handoff needs 2 or more")
        if self.turns < 2 * self.jobs:
            raise ValueError(f"turns {self.turns}: at least 2 per job")
        if not 0 < self.hold_ms < math.inf:
            raise ValueError(f"hold-ms {self.hold_ms:g} must be a number of milliseconds above 0")
        if self.crossed < 2:
            raise ValueError(f"crossed {self.crossed}: at least 2 (one turn per crossing job)")


def run_gang_bench(setup: GangSetup) -> dict[str, Any]:
    """Run every phase on one cluster; returns the bench's JSON fields."""
    setup.check()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="baton-gang-") as workdir:
        cluster = GangCluster(Path(workdir), setup.nodes, setup.pin)
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
            cpus = [node.cpu for node in cluster.nodes]
    return _report(setup, found, load, cpus)


async def _phases(
    setup: GangSetup,
    cluster: GangCluster,
    jobs: dict[str, dict[str, str]],
    parking: dict[str, dict[str, str]],
    cross: list[str],
) -> Figures:
    links = RecordingLinks(TOKEN)
    arbiter = await leading(cluster.view, links)
    found = Figures()
    try:
        each = max(2, setup.turns // (setup.jobs * setup.rounds))
        for _ in range(setup.rounds):
            turns = await take_turns(arbiter, list(jobs), each, HANDOFF_HOLD_MS)
            found.handoffs += handoffs(turn_records(turns))
            skews(turns, links, found)
            found.reference += handoffs(await reference(cluster.nodes[0], each))
        parked_each = max(1, setup.turns // setup.jobs)
        await efficiency(cluster, arbiter, parking, parked_each, setup.hold_ms, links, found)
        await crossed(arbiter, cross, setup.crossed, found)
    finally:
        await arbiter.close()
        await links.close()
    return found


def _report(
    setup: GangSetup, found: Figures, load: float, cpus: list[int | None]
) -> dict[str, Any]:
    """The JSON fields; `cpus`: each node's agent's CPU (None: any), as `GangCluster` set it."""
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
        "agent_cpus": cpus,
        "load_1m": round(load, 2),
        "meets_handoff_target": handoff_p99 <= reference_p99 + TARGETS["handoff_over_reference_ms"],
        "meets_skew_target": skew_p99 <= TARGETS["skew_ms"],
        "meets_efficiency_target": found.efficiency >= TARGETS["efficiency"],
        "meets_deadlock_target": found.deadlocks == 0 and found.crossed_turns == setup.crossed,
    }

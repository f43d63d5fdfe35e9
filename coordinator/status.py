"""What the coordinator tells operators: Prometheus metrics and its /v1/status document."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from coordinator.turns import Arbiter

HANDOVER_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class CoordinatorMetrics:
    """`baton_coordinator_*`; the arbiter reports grants and failures through it."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.leading = Gauge("baton_coordinator_leading", "1 while this replica leads", registry=r)
        self.epoch = Gauge(
            "baton_coordinator_epoch", "The epoch this replica leads with", registry=r
        )
        self.granted = Counter(
            "baton_coordinator_job_turns_granted_total",
            "Job turns granted on every node",
            registry=r,
        )
        self.failed = Counter(
            "baton_coordinator_job_turn_failures_total",
            "Job turns rolled back because a node could not prepare",
            ["node"],
            registry=r,
        )
        self.handover = Histogram(
            "baton_coordinator_handover_seconds",
            "From a job's GPUs becoming free to its turn prepared on every node",
            buckets=HANDOVER_BUCKETS,
            registry=r,
        )
        self.held = Gauge(
            "baton_coordinator_job_turns_held",
            "Job turns held now, one per turn: a turn held for several llm-d groups counts once",
            registry=r,
        )
        self.waiting = Gauge(
            "baton_coordinator_job_turns_waiting", "Job turns asked for", registry=r
        )
        self.unsettled = Gauge(
            "baton_coordinator_agents_unsettled",
            "Agents this leader has not heard yet (their job turns not settled)",
            registry=r,
        )


def status_json(arbiter: Arbiter, identity: str, leading: bool, now: float) -> dict[str, Any]:
    """Who leads, which job turns are held where, who waits, the agents known, and those not
    heard yet (their job turns unsettled)."""
    table = arbiter.table
    return {
        "time": now,
        "identity": identity,
        "leading": leading,
        "epoch": arbiter.epoch,
        "held": {
            key: {
                "turn_id": turn.turn_id,
                "nodes": sorted(turn.nodes),
                "gpus": list(turn.resources),
                "held_s": round(now - turn.granted_at, 6),
                "joined": sorted(turn.joined),
            }
            for key, turn in sorted(arbiter.held.items())
        },
        "waiting": [
            {
                "job": w.tenant_id,
                "gpus": list(w.gpus),
                "waited_s": round(now - w.enqueued_at, 6),
                "preparing": w.reserved,
            }
            for w in table.queue()
        ],
        "agents": arbiter.view.addresses(),
        "unsettled": dict(sorted(arbiter.settling.unsettled.items())),
    }


def turns_held(arbiter: Arbiter) -> int:
    """The turns held: one that covers several of its job's groups is held for each of them."""
    return len({id(turn) for turn in list(arbiter.held.values())})


def watch(metrics: CoordinatorMetrics, arbiter: Arbiter) -> None:
    """Gauges read at each scrape; the arbiter's grants and failures counted as they happen."""
    metrics.leading.set_function(lambda: 1 if arbiter.epoch else 0)
    metrics.epoch.set_function(lambda: arbiter.epoch)
    metrics.held.set_function(lambda: turns_held(arbiter))
    metrics.waiting.set_function(lambda: len(arbiter.table.waiters))
    metrics.unsettled.set_function(lambda: len(arbiter.settling.unsettled))

    def granted(seconds: float) -> None:
        metrics.granted.inc()
        metrics.handover.observe(seconds)

    failed_on: set[str] = set()

    def failed(node: str) -> None:
        failed_on.add(node)
        metrics.failed.labels(node=node).inc()

    def pruned() -> None:  # nodes come and go all day, each name seen once
        with arbiter.view.lock:
            gone = failed_on - arbiter.view.nodes.keys()
        for node in gone:
            failed_on.discard(node)
            metrics.failed.remove(node)

    arbiter.on_granted = granted
    arbiter.on_failed = failed
    arbiter.on_pruned = pruned


def readiness(
    epoch: int, taking_over: bool, lease: str, failing: str, unlisted: dict[str, str]
) -> str | None:
    """Why a replica grants no job turns now (`/readyz`), or None while it leads with every watch
    listed. `epoch`: the one it leads with (0: none); `taking_over`: it holds the Lease and is
    recovering; `failing`: why its latest Lease call failed ("" if answered); `unlisted`: each
    watch that has not listed once → why ("" if no attempt failed yet)."""
    blind = _not_listed(unlisted)
    if epoch:
        known = "it knows no job or agent it does not list"
        return f"leading with epoch {epoch}, but {blind}: {known}" if blind else None
    if taking_over:
        waits = f"waiting for its watches: {blind}" if blind else ""
        return f"taking over as leader ({lease}): {waits or 'settling the turns the agents hold'}"
    if failing:
        why = f"not leading: {lease} cannot be read or taken ({failing}); asking again"
    else:
        why = f"not leading: this replica stands by to take over when {lease} is free"
    refused = _not_listed({what: why for what, why in unlisted.items() if why})
    return f"{why}; {refused}" if refused else why


def _not_listed(unlisted: dict[str, str]) -> str:
    return "; ".join(
        f"the {what} has not listed once ({why or 'no answer yet'})"
        for what, why in sorted(unlisted.items())
    )

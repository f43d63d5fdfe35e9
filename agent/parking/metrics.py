"""Prometheus metrics of parking and restoring tenants' GPU memory."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from agent.core.planner import Reason
from agent.parking.backends.base import Move
from baton.contract.names import METRICS_PREFIX

STAGES = ("grant", "ahead", "revoke", "request", "handed", "yielded")
"""When a move is made: while a grant waits, ahead of a turn, for a revocation, on request, by
the tenant itself as its grant arrives (a restore the agent handed to it), or by the tenant
itself as it yields (a park the agent asked of it, `ParkAtYield`)."""
MOVE_BUCKETS = (0.001, 0.005, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ParkingMetrics:
    """Counters, histograms and gauges for one backend, registered in `registry`.

    Moves are labelled with the parking method that made them (`methods`, default `backend`)."""

    def __init__(
        self,
        backend: str,
        registry: CollectorRegistry | None = None,
        methods: tuple[str, ...] = (),
    ) -> None:
        self.backend = backend
        reg = registry if registry is not None else CollectorRegistry()
        self.registry = reg
        p = METRICS_PREFIX
        labels = ("backend", "direction")
        self.moves = Counter(f"{p}moves", "Parks and restores done.", labels, registry=reg)
        self.move_seconds = Histogram(
            f"{p}move_seconds", "Time one park or restore took.", labels,
            buckets=MOVE_BUCKETS, registry=reg,
        )  # fmt: skip
        self.moved_bytes = Counter(
            f"{p}moved_bytes", "Bytes of GPU memory parked or restored.", labels, registry=reg
        )
        self.moved_when = Counter(
            f"{p}moved_bytes_by_stage",
            "Bytes of GPU memory moved, by when: while a grant waited, ahead of a turn (while "
            "the GPU was held), or for a revocation.",
            ("backend", "direction", "stage"),
            registry=reg,
        )
        self.move_failures = Counter(
            f"{p}move_failures", "Parks and restores that failed.", labels, registry=reg
        )
        self.parked_bytes = Gauge(
            f"{p}parked_bytes", "GPU memory parked in host DRAM on this node.", registry=reg
        )
        self.host_budget = Gauge(
            f"{p}host_memory_budget_bytes", "Host DRAM budget for parked memory.", registry=reg
        )
        self.refused = Counter(
            f"{p}refused_parks",
            "Turns that could not be prepared yet, by reason.",
            ("reason",),
            registry=reg,
        )
        for method in methods or (backend,):
            for direction in ("park", "restore"):
                for family in (self.moves, self.move_seconds, self.moved_bytes, self.move_failures):
                    family.labels(method, direction)
                for stage in STAGES:
                    self.moved_when.labels(method, direction, stage)
        for reason in (*Reason, "move_failed", "quarantined"):  # each shows, at 0 until it happens
            self.refused.labels(reason)
        self.quarantined = Gauge(
            f"{p}quarantined_tenants",
            "Tenants whose memory the backend can no longer move safely: they take no turns.",
            registry=reg,
        )
        self.quarantines = Counter(
            f"{p}quarantines", "Tenants quarantined since the agent started.", registry=reg
        )
        self.preemptions = Counter(
            f"{p}preemptions",
            "Holders parked for a revocation (maximum hold or tier grace).",
            registry=reg,
        )

    def moved(self, move: Move, stage: str = "grant", method: str = "", timed: bool = True) -> None:
        """Count one finished move, made at `stage` (one of `STAGES`) by `method`; `timed`
        False: not one the agent timed (a restore left to the tenant's grant)."""
        by = method or self.backend
        self.moved_when.labels(by, move.direction, stage).inc(move.bytes)
        self.moves.labels(by, move.direction).inc()
        if timed:
            self.move_seconds.labels(by, move.direction).observe(move.seconds)
        self.moved_bytes.labels(by, move.direction).inc(move.bytes)

    def failed(self, direction: str, method: str = "") -> None:
        """Count one failed move by `method`."""
        self.move_failures.labels(method or self.backend, direction).inc()


class Forward(Collector):
    """Exposes another registry's metrics through the registry this is registered in."""

    def __init__(self, source: CollectorRegistry) -> None:
        self.source = source

    def collect(self) -> Iterable[Metric]:
        """Everything `source` collects."""
        return self.source.collect()

"""Prometheus metrics of the lease service, in a registry of their own (one per agent)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from baton.names import METRICS_PREFIX

if TYPE_CHECKING:
    from agent.leases import Lease, LeaseTable

_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800)


class AgentMetrics:
    """Counters and histograms the service updates, plus gauges read from the table."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        p = METRICS_PREFIX
        self.grants = Counter(f"{p}grants", "Turns granted.", ["gpu"], registry=self.registry)
        self.waits = Histogram(
            f"{p}wait_seconds",
            "Time from request to grant.",
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.holds = Histogram(
            f"{p}hold_seconds", "Time a turn was held.", buckets=_BUCKETS, registry=self.registry
        )
        self.revocations = Counter(
            f"{p}revocations",
            "Leases revoked for holding past the maximum.",
            registry=self.registry,
        )
        self._busy: dict[str, float] = {}

    def granted(self, lease: Lease, waited: float) -> None:
        """A turn started."""
        self.waits.observe(max(0.0, waited))
        for gpu in lease.gpus:
            self.grants.labels(gpu=gpu).inc()

    def released(self, lease: Lease, now: float, revoked: bool = False) -> float:
        """A turn ended; returns how long it was held."""
        held = max(0.0, now - lease.granted_at)
        self.holds.observe(held)
        for gpu in lease.gpus:
            self._busy[gpu] = self._busy.get(gpu, 0.0) + held
        if revoked:
            self.revocations.inc()
        return held

    def watch(
        self, table: LeaseTable, tenants: Callable[[], int], clock: Callable[[], float]
    ) -> None:
        """Export queue depth, busy seconds and active tenants read live from the service."""
        self.registry.register(_TableCollector(self, table, tenants, clock))

    def busy_seconds(self, table: LeaseTable, gpu: str, now: float) -> float:
        """Seconds the GPU has been held, the current turn included."""
        since = table.gpu(gpu).busy_since
        return self._busy.get(gpu, 0.0) + (0.0 if since is None else max(0.0, now - since))


class _TableCollector(Collector):
    def __init__(
        self,
        metrics: AgentMetrics,
        table: LeaseTable,
        tenants: Callable[[], int],
        clock: Callable[[], float],
    ) -> None:
        self._metrics, self._table, self._tenants, self._clock = metrics, table, tenants, clock

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        p = METRICS_PREFIX
        depth = GaugeMetricFamily(f"{p}queue_depth", "Waiters per GPU.", labels=["gpu"])
        busy = CounterMetricFamily(
            f"{p}gpu_busy_seconds", "Seconds a GPU was held (rate = duty cycle).", labels=["gpu"]
        )
        now = self._clock()
        for gpu in sorted(self._table.gpus):
            depth.add_metric([gpu], len(self._table.queue_of(gpu)))
            busy.add_metric([gpu], self._metrics.busy_seconds(self._table, gpu, now))
        yield depth
        yield busy
        yield GaugeMetricFamily(
            f"{p}active_tenants", "Tenants with an open session.", value=self._tenants()
        )

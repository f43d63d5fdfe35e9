"""Prometheus metrics of the lease service, in a registry of their own (one per agent)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from agent.server.accounting import Accounting
from baton.contract.names import METRICS_PREFIX

if TYPE_CHECKING:
    from agent.core.leases import Lease, LeaseTable

DUTY_WINDOW_S = 60.0
"""The window of `duty_last_minute` in /v1/status."""
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
        self.tier_waits = Histogram(
            f"{p}tier_wait_seconds",
            "Time from request to grant, per priority tier.",
            ["tier"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.holds = Histogram(
            f"{p}hold_seconds", "Time a turn was held.", buckets=_BUCKETS, registry=self.registry
        )
        self.revocations = Counter(
            f"{p}revocations",
            "Leases revoked: held past the maximum hold, or past the tier grace for a higher tier.",
            registry=self.registry,
        )
        self._busy: dict[str, float] = {}
        self._counted_from: dict[str, float] = {}
        """Lease id → when this agent took over a lease restored after a restart: its GPUs'
        busy seconds count from there (those before were the previous agent's counter's)."""
        self._turns: dict[str, deque[tuple[float, float, str]]] = {}
        self.accounting = Accounting()
        """GPU-seconds and parked byte-seconds per tenant, namespace and tier (persisted)."""
        self.tier_of: Callable[[str], int] = lambda tenant_id: 0
        """A tenant's tier, for the accounting's labels (the service sets it)."""

    def granted(self, lease: Lease, waited: float) -> None:
        """A turn started."""
        self.waits.observe(max(0.0, waited))
        self.tier_waits.labels(tier=str(self.tier_of(lease.tenant_id))).observe(max(0.0, waited))
        for gpu in lease.gpus:
            self.grants.labels(gpu=gpu).inc()

    def restored(self, lease_id: str, at: float) -> None:
        """A lease held across a restart was restored `at` (its GPUs busy since)."""
        self._counted_from[lease_id] = at

    def released(
        self, lease: Lease, now: float, revoked: bool = False, tier: int | None = None
    ) -> float:
        """A turn ended; returns how long it was held (`tier`: its tenant's, read before the
        table forgot the tenant)."""
        held = max(0.0, now - lease.granted_at)
        self.holds.observe(held)
        since = max(lease.granted_at, self._counted_from.pop(lease.lease_id, lease.granted_at))
        for gpu in lease.gpus:
            self._busy[gpu] = self._busy.get(gpu, 0.0) + max(0.0, now - since)
            turns = self._turns.setdefault(gpu, deque())
            turns.append((lease.granted_at, now, lease.tenant_id))
            while turns and turns[0][1] < now - DUTY_WINDOW_S:
                turns.popleft()
        if revoked:
            self.revocations.inc()
        tier = self.tier_of(lease.tenant_id) if tier is None else tier
        self.accounting.held(lease.tenant_id, tier, lease.gpus, held)
        return held

    def watch(
        self,
        table: LeaseTable,
        tenants: Callable[[], int],
        clock: Callable[[], float],
        gpu_tenants: Callable[[], Mapping[str, int]] = dict,
        gpus: Collection[str] = (),
    ) -> None:
        """Export queue depth, busy seconds, holders and tenants read live from the service;
        every one of `gpus` (the node's) has its series from the start, at 0 until it is used."""
        for gpu in gpus:
            self.grants.labels(gpu=gpu)
        self.registry.register(_TableCollector(self, table, tenants, clock, gpu_tenants, gpus))

    def busy_seconds(self, table: LeaseTable, gpu: str, now: float) -> float:
        """Seconds the GPU has been held, the current turn included."""
        since = table.gpu(gpu).busy_since
        return self._busy.get(gpu, 0.0) + (0.0 if since is None else max(0.0, now - since))

    def duty_last_minute(self, table: LeaseTable, gpu: str, now: float) -> float:
        """Share of the last `DUTY_WINDOW_S` seconds the GPU was held, 0 to 1."""
        start = now - DUTY_WINDOW_S
        busy = sum(
            max(0.0, min(end, now) - max(begin, start))
            for begin, end, _ in self._turns.get(gpu, ())
        )
        since = table.gpu(gpu).busy_since
        if since is not None:
            busy += max(0.0, now - max(since, start))
        return min(1.0, busy / DUTY_WINDOW_S)

    def share_last_minute(self, gpu: str, tenant_id: str, now: float) -> float:
        """Share of the last `DUTY_WINDOW_S` seconds of the GPU the tenant's ended turns took."""
        start = now - DUTY_WINDOW_S
        held = sum(
            max(0.0, min(end, now) - max(begin, start))
            for begin, end, who in self._turns.get(gpu, ())
            if who == tenant_id
        )
        return min(1.0, held / DUTY_WINDOW_S)


class _TableCollector(Collector):
    def __init__(
        self,
        metrics: AgentMetrics,
        table: LeaseTable,
        tenants: Callable[[], int],
        clock: Callable[[], float],
        gpu_tenants: Callable[[], Mapping[str, int]],
        gpus: Collection[str],
    ) -> None:
        self._metrics, self._table, self._tenants, self._clock = metrics, table, tenants, clock
        self._gpu_tenants, self._gpus = gpu_tenants, frozenset(gpus)

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        p = METRICS_PREFIX
        depth = GaugeMetricFamily(f"{p}queue_depth", "Waiters per GPU.", labels=["gpu"])
        busy = CounterMetricFamily(
            f"{p}gpu_busy_seconds", "Seconds a GPU was held (rate = duty cycle).", labels=["gpu"]
        )
        holder = GaugeMetricFamily(
            f"{p}gpu_holder", "1 for the tenant holding the GPU's turn.", labels=["gpu", "tenant"]
        )
        registered = GaugeMetricFamily(
            f"{p}gpu_tenants", "Tenants registered on a GPU.", labels=["gpu"]
        )
        now = self._clock()
        counts = self._gpu_tenants()
        for gpu in sorted(self._table.gpus.keys() | self._gpus):
            state = self._table.gpus.get(gpu)  # None: no tenant named it yet (idle, all 0)
            depth.add_metric([gpu], len(self._table.queue_of(gpu)))
            seconds = 0.0 if state is None else self._metrics.busy_seconds(self._table, gpu, now)
            busy.add_metric([gpu], seconds)
            registered.add_metric([gpu], counts.get(gpu, 0))
            lease = self._table.leases.get((state and state.holder) or "")
            if lease is not None:
                holder.add_metric([gpu, lease.tenant_id], 1)
        yield from (depth, busy, holder, registered)
        yield GaugeMetricFamily(
            f"{p}active_tenants", "Tenants with an open session.", value=self._tenants()
        )

"""The extender's Prometheus metrics, in a registry of their own."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from baton.contract.names import METRICS_PREFIX

_P = f"{METRICS_PREFIX}extender_"
VERBS = ("filter", "prioritize", "bind")
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Metrics:
    """Counters and histograms for the verbs, binds and the cache."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            f"{_P}requests",
            "Extender requests by verb and HTTP status.",
            ["verb", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            f"{_P}request_seconds",
            "Time to answer a verb.",
            ["verb"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.filtered = Counter(
            f"{_P}filtered_nodes",
            "Nodes judged by filter, by outcome.",
            ["outcome"],
            registry=self.registry,
        )
        self.binds = Counter(
            f"{_P}binds", "Bind attempts by result.", ["result"], registry=self.registry
        )
        self.watch_restarts = Counter(
            f"{_P}watch_restarts",
            "Watches that failed and were listed again.",
            ["kind"],
            registry=self.registry,
        )
        self.claim_waits = Counter(
            f"{_P}claim_waits",
            "Filters that waited for the claim watch to show a claim the pod names, by whether "
            "it came in time.",
            ["outcome"],
            registry=self.registry,
        )
        for outcome in ("seen", "timeout"):
            self.claim_waits.labels(outcome)
        for verb in VERBS:  # every series shows from the start, not only after its first use
            self.latency.labels(verb)
            self.requests.labels(verb, "200")
        for outcome in ("passed", "failed", "unresolvable"):
            self.filtered.labels(outcome)
        for result in ("bound", "error"):
            self.binds.labels(result)
        self._answered: dict[tuple[str, int], tuple[Any, Any]] = {}
        self.nodes = Gauge(f"{_P}cache_nodes", "Nodes in the cache.", registry=self.registry)
        self.assumed = Gauge(
            f"{_P}assumed_pods", "Binds not yet confirmed by the watch.", registry=self.registry
        )

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)

    def answered(self, verb: str, code: int, seconds: float) -> None:
        """One answered request: its status counted, its time observed (the labelled series
        are looked up once: the verbs are on kube-scheduler's path)."""
        series = self._answered.get((verb, code))
        if series is None:
            series = (self.requests.labels(verb, str(code)), self.latency.labels(verb))
            self._answered[(verb, code)] = series
        series[0].inc()
        series[1].observe(seconds)

"""The real Prometheus scrapes the whole node during the end-to-end run; every dashboard query
returns data when Prometheus evaluates it over that run, as Grafana would."""

from __future__ import annotations

import math
import time

import pytest

from baton.contract.names import MIB
from tests.e2e.node import TENANT_MIB, TENANTS, Node
from tests.e2e.prometheus import MISSING, SCRAPE_INTERVAL_S, binary
from tests.test_dashboard import dashboard, queries

RATE_INTERVAL = f"{4 * SCRAPE_INTERVAL_S}s"
"""Grafana's $__rate_interval: max(4 scrape intervals, step + 1 scrape interval), step 1 s."""


def grafana_variables(expr: str, seconds: int) -> str:
    """Expand the Grafana variables the dashboard uses."""
    return expr.replace("$__rate_interval", RATE_INTERVAL).replace("$__range", f"{seconds}s")


def values_over_the_run(node: Node, expr: str) -> list[float]:
    """Every finite value `expr` took over the run, evaluated as Grafana's time series would."""
    server = node.prometheus
    assert server is not None
    end = time.time()
    query = grafana_variables(expr, int(end - server.started_at) + 1)
    result = server.query_range(query, server.started_at, end, step=SCRAPE_INTERVAL_S)
    values = [float(v[1]) for series in result for v in series["values"]]
    return [v for v in values if math.isfinite(v)]  # NaN quantiles (nothing observed) excluded


@pytest.fixture(scope="module")
def prometheus(request: pytest.FixtureRequest) -> Node:
    if binary() is None:
        pytest.skip(MISSING)
    node: Node = request.getfixturevalue("node")
    assert node.prometheus is not None
    node.prometheus.wait_scraped_after(node.finished_at)
    return node


def test_prometheus_scraped_all_three_daemons(prometheus: Node) -> None:
    assert prometheus.prometheus is not None
    up = prometheus.prometheus.query("up")
    jobs = {series["metric"]["job"]: series["value"][1] for series in up}
    assert jobs == {"baton-agent": "1", "baton-deviceplugin": "1", "baton-extender": "1"}


def test_every_dashboard_query_returns_data_over_the_run(prometheus: Node) -> None:
    empty = [
        f"{title}: {expr}"
        for title, expr in queries(dashboard())
        if not values_over_the_run(prometheus, expr)
    ]
    assert not empty, "queries without data:\n" + "\n".join(empty)


def largest(node: Node, title: str, legend: str | None = None) -> float:
    """The largest value a panel's query (the one with `legend`) took over the run."""
    panel = next(p for p in dashboard()["panels"] if p["title"] == title)
    target = next(t for t in panel["targets"] if legend is None or t["legendFormat"] == legend)
    return max(values_over_the_run(node, target["expr"]), default=math.nan)


def test_the_dashboard_tells_the_story_of_the_run(prometheus: Node) -> None:
    assert largest(prometheus, "Tenants per GPU") == len(TENANTS)
    assert 0 < largest(prometheus, "Duty cycle per GPU") <= 1
    assert largest(prometheus, "Queue depth") >= 1
    assert largest(prometheus, "Park / restore throughput") > 0
    assert largest(prometheus, "Parked bytes vs host budget", "parked {{instance}}") >= (
        TENANT_MIB * MIB
    )
    assert largest(prometheus, "Device health", "slots {{health}}") == 8
    assert largest(prometheus, "Allocate latency p50 / p99", "p99") > 0

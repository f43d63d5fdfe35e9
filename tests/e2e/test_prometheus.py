"""The real Prometheus scrapes the whole node during the end-to-end run; every dashboard query
returns data when Prometheus evaluates it over that run, as Grafana would."""

from __future__ import annotations

import math

import pytest

from baton.contract.names import MIB
from tests.e2e.node import TENANT_MIB, TENANTS, Node
from tests.e2e.prometheus import MISSING, binary
from tests.test_dashboard import dashboard, queries

COORDINATOR = "baton_coordinator_"
"""The coordinator's metrics, which only its dashboard row reads."""


def values_over_the_run(node: Node, expr: str) -> list[float]:
    """Every finite value `expr` took over the run, evaluated as Grafana's time series would."""
    assert node.prometheus is not None
    return node.prometheus.values_since_start(expr)


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
    """But the job turns' row: the node runs no coordinator
    (tests/coordinator/test_dashboard_row.py evaluates that row over a real coordinator's run)."""
    empty = [
        f"{title}: {expr}"
        for title, expr in queries(dashboard())
        if COORDINATOR not in expr and not values_over_the_run(prometheus, expr)
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

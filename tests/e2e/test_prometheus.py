"""The real Prometheus scrapes the whole node during the end-to-end run; every dashboard query
returns data when Prometheus evaluates it over that run, as Grafana would."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

from tests.e2e.node import Node
from tests.e2e.prometheus import MISSING, SCRAPE_INTERVAL_S, binary
from tests.test_dashboard import dashboard, queries

RATE_INTERVAL = f"{4 * SCRAPE_INTERVAL_S}s"
"""Grafana's $__rate_interval: max(4 scrape intervals, step + 1 scrape interval), step 1 s."""


def grafana_variables(expr: str, seconds: int) -> str:
    """Expand the Grafana variables the dashboard uses."""
    return expr.replace("$__rate_interval", RATE_INTERVAL).replace("$__range", f"{seconds}s")


def has_a_number(result: list[dict[str, Any]]) -> bool:
    """At least one finite value in a range query's matrix (NaN quantiles do not count)."""
    values = [float(v[1]) for series in result for v in series.get("values", [])]
    return any(math.isfinite(v) for v in values)


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
    server = prometheus.prometheus
    assert server is not None
    end = time.time()
    start = server.started_at
    empty = []
    for title, expr in queries(dashboard()):
        query = grafana_variables(expr, int(end - start) + 1)
        result = server.query_range(query, start, end, step=SCRAPE_INTERVAL_S)
        if not has_a_number(result):
            empty.append(f"{title}: {query}")
    assert not empty, "queries without data:\n" + "\n".join(empty)

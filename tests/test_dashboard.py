"""The Grafana dashboard queries only metrics our daemons export, and covers what operators read."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from agent.core.leases import LeaseTable
from agent.parking.metrics import Forward, ParkingMetrics
from agent.server.accounting import AccountingCollector
from agent.server.metrics import AgentMetrics
from coordinator.status import CoordinatorMetrics
from extender.metrics import Metrics as ExtenderMetrics
from nodegpu.metrics import Metrics as DevicePluginMetrics

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "manifests" / "grafana" / "baton.json"
METRIC = re.compile(r"\bbaton_[a-z0-9_]+\b")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
}
OPERATOR_READS_FIRST = {
    "duty cycle per GPU": "baton_gpu_busy_seconds_total",
    "tenants per GPU": "baton_gpu_tenants",
    "who holds each GPU": "baton_gpu_holder",
    "queue depth": "baton_queue_depth",
    "acquire wait": "baton_wait_seconds_bucket",
    "park/restore GB/s": "baton_moved_bytes_total",
    "park/restore seconds": "baton_move_seconds_bucket",
    "parked bytes": "baton_parked_bytes",
    "host budget": "baton_host_memory_budget_bytes",
    "refused parks by reason": "baton_refused_parks_total",
    "lease revocations": "baton_revocations_total",
    "extender latency by verb": "baton_extender_request_seconds_bucket",
    "extender errors by verb": "baton_extender_requests_total",
    "Allocate latency": "baton_deviceplugin_allocate_seconds_bucket",
    "Allocate fallbacks": "baton_deviceplugin_fallback_assignments_total",
    "device health": "baton_deviceplugin_devices",
    "GPU share by namespace": "baton_tenant_gpu_seconds_total",
    "parked memory by namespace": "baton_tenant_parked_byte_seconds_total",
    "acquire wait by tier": "baton_tier_wait_seconds_bucket",
    "job turns held": "baton_coordinator_job_turns_held",
    "job turns waiting": "baton_coordinator_job_turns_waiting",
    "job handover": "baton_coordinator_handover_seconds_bucket",
    "job turns rolled back": "baton_coordinator_job_turn_failures_total",
    "coordinator leader": "baton_coordinator_leading",
    "agents the leader has not heard": "baton_coordinator_agents_unsettled",
}
SPLIT_BY = {
    "GPU share by namespace": ("baton_tenant_gpu_seconds_total", "namespace"),
    "GPU time by tier": ("baton_tenant_gpu_seconds_total", "tier"),
    "Acquire wait p99 by tier": ("baton_tier_wait_seconds_bucket", "tier"),
    "GPU-seconds by tenant": ("baton_tenant_gpu_seconds_total", "tenant"),
    "Parked memory by namespace": ("baton_tenant_parked_byte_seconds_total", "namespace"),
}
"""Panels over the accounting and the tiers, the metric each reads and the label it splits by."""


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' nested panels included."""
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel."""
    return [(p["title"], t["expr"]) for p in panels(board) for t in p.get("targets", [])]


def agent_registry() -> CollectorRegistry:
    """The agent's registry as the daemon composes it: lease metrics, the accounting (one turn
    ended, so its counters have labels), parking metrics."""
    metrics = AgentMetrics()
    table = LeaseTable(clock=time.time, policy="fifo", max_hold=60.0)
    metrics.watch(table, lambda: 0, time.time)
    metrics.accounting.held("ns/a", 0, ("GPU-0",), 1.0)
    metrics.registry.register(AccountingCollector(metrics.accounting, lambda: None))
    metrics.registry.register(Forward(ParkingMetrics("fake").registry))
    return metrics.registry


def exported_names() -> set[str]:
    """Every sample name the agent, extender, device plugin and coordinator registries can
    expose."""
    registries = [
        agent_registry(),
        ExtenderMetrics().registry,
        DevicePluginMetrics().registry,
        CoordinatorMetrics().registry,
    ]
    names: set[str] = set()
    for registry in registries:
        for family in registry.collect():
            names.update(family.name + suffix for suffix in SUFFIXES[family.type])
            names.update(sample.name for sample in family.samples)
    return names


def test_every_queried_metric_is_exported_by_our_code() -> None:
    exported = exported_names()
    missing = {
        f"{title}: {name}"
        for title, expr in queries(dashboard())
        for name in METRIC.findall(expr)
        if name not in exported
    }
    assert not missing, f"queried but exported by no Baton daemon: {sorted(missing)}"


def test_every_query_reads_a_baton_metric() -> None:
    found = queries(dashboard())
    assert found
    for title, expr in found:
        assert METRIC.search(expr), f"{title}: {expr} reads no baton_ metric"


def test_the_panels_an_operator_reads_first_are_there() -> None:
    used = {name for _title, expr in queries(dashboard()) for name in METRIC.findall(expr)}
    absent = [topic for topic, metric in OPERATOR_READS_FIRST.items() if metric not in used]
    assert not absent, f"no panel for {absent}"


def test_share_wait_and_tier_panels_split_their_metric_by_the_right_label() -> None:
    by_title = {p["title"]: [t["expr"] for t in p.get("targets", [])] for p in panels(dashboard())}
    for title, (metric, label) in SPLIT_BY.items():
        assert title in by_title, f"no panel {title!r}"
        exprs = [e for e in by_title[title] if metric in e]
        assert exprs and all(re.search(rf"by \([^)]*\b{label}\b", e) for e in exprs), title


def test_panels_are_well_formed_for_grafana() -> None:
    board = dashboard()
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"] for v in board["templating"]["list"]}
    for panel in panels(board):
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}" and "datasource" in variables
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), panel["title"]


def test_the_dashboard_ships_as_a_configmap_for_grafanas_sidecar() -> None:
    kustomization = yaml.safe_load((DASHBOARD.parent / "kustomization.yaml").read_text())
    generated = kustomization["configMapGenerator"]
    assert any(DASHBOARD.name in entry.get("files", []) for entry in generated)
    assert kustomization["generatorOptions"]["labels"].get("grafana_dashboard") == "1"

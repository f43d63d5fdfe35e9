"""The Prometheus operator's monitors the chart renders: each daemon's series reach Prometheus
with the labels the daemon gave them."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from coordinator.status import CoordinatorMetrics
from extender.metrics import Metrics as ExtenderMetrics
from nodegpu.metrics import Metrics as NodeGpuMetrics
from tests.chart.helm import render
from tests.test_dashboard import agent_registry

TARGET_LABELS = {"namespace", "pod", "container", "endpoint", "job", "instance", "service"}
"""Labels the Prometheus operator gives every target of a PodMonitor or ServiceMonitor. A scraped
series' own label of one of these names is renamed `exported_<name>` (the target's value takes
its place) unless the endpoint honours the scraped labels."""

REGISTRIES: dict[str, Callable[[], CollectorRegistry]] = {
    "baton-agent": agent_registry,
    "baton-deviceplugin": lambda: NodeGpuMetrics().registry,
    "baton-dra": lambda: NodeGpuMetrics().registry,
    "baton-coordinator": lambda: CoordinatorMetrics().registry,
    "baton-extender": lambda: ExtenderMetrics().registry,
}
"""Each monitor's daemon, as its registry (the agent's with a turn ended: its accounting series)."""


def series_labels(registry: CollectorRegistry) -> set[str]:
    return {label for family in registry.collect() for s in family.samples for label in s.labels}


def test_the_agents_tenant_series_carry_a_label_the_operator_sets_too() -> None:
    """What the test below guards: `baton_tenant_*{tenant,namespace,tier}` (docs/agent.md)."""
    assert "namespace" in series_labels(agent_registry()) & TARGET_LABELS


@pytest.mark.parametrize(
    "where",
    [(), ("--api-versions", "resource.k8s.io/v1", "--kube-version", "1.36.2")],
    ids=["deviceplugin", "dra"],
)
def test_every_label_a_daemons_series_carry_reaches_prometheus_as_given(
    where: tuple[str, ...],
) -> None:
    """Without honorLabels the tenants' `namespace` reached Prometheus as `exported_namespace`,
    and `namespace` was the agent pod's (baton-system): the dashboard's GPU share and parked
    memory by namespace showed one namespace, baton-system, for every tenant."""
    objs = render("--set", "monitoring.monitors=true", *where)
    monitors = [o for o in objs if o["kind"] in ("PodMonitor", "ServiceMonitor")]
    assert {m["metadata"]["name"] for m in monitors} >= {"baton-agent", "baton-extender"}
    for monitor in monitors:
        name, spec = monitor["metadata"]["name"], monitor["spec"]
        clashing = series_labels(REGISTRIES[name]()) & TARGET_LABELS
        for endpoint in spec.get("podMetricsEndpoints", spec.get("endpoints", [])):
            if clashing:
                assert endpoint.get("honorLabels") is True, (
                    f"{name}: its series' {sorted(clashing)} would be renamed exported_*"
                )

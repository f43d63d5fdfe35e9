"""The chart's opt-in NetworkPolicies (`networkPolicy.*`): every port a daemon serves stays
reachable by the callers docs/deploy.md names for it, and by no one else."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart.helm import render

ON = ["--set", "networkPolicy.enabled=true"]
PROMETHEUS = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {},
}


def _workloads(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Pod name label → pod spec, for every Deployment and DaemonSet of the release."""
    found = {}
    for obj in objs:
        if obj["kind"] in ("Deployment", "DaemonSet"):
            template = obj["spec"]["template"]
            found[template["metadata"]["labels"]["app.kubernetes.io/name"]] = template["spec"]
    return found


def _rules(objs: list[dict[str, Any]]) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """Pod name label → port → the peers admitted to it."""
    rules: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for obj in objs:
        if obj["kind"] != "NetworkPolicy":
            continue
        spec = obj["spec"]
        assert spec["policyTypes"] == ["Ingress"]
        name = spec["podSelector"]["matchLabels"]["app.kubernetes.io/name"]
        for rule in spec["ingress"]:
            for port in rule["ports"]:
                rules.setdefault(name, {}).setdefault(port["port"], []).extend(rule["from"])
    return rules


@pytest.mark.parametrize(
    "values",
    [
        ["--set", "kubeletPlugin=deviceplugin"],
        ["--set", "kubeletPlugin=dra", "--set", "agent.llmd.listen=0.0.0.0:50052"],
        ["--set", "kubeletPlugin=dra", "--set", "coordinator.enabled=false"],
    ],
    ids=["deviceplugin", "dra-llmd", "no-coordinator"],
)
def test_every_served_port_is_admitted_to_prometheus_or_its_callers(values: list[str]) -> None:
    objs = render(*ON, *values)
    workloads, rules = _workloads(objs), _rules(objs)
    assert set(rules) == set(workloads), "a policy per daemon, none for what is not deployed"
    for name, pod in workloads.items():
        served = {p["containerPort"] for c in pod["containers"] for p in c.get("ports", [])}
        assert set(rules[name]) == served, (name, served, set(rules[name]))
    for name in workloads:  # each daemon's status or metrics port
        assert any(PROMETHEUS in peers for peers in rules[name].values()), name


def test_each_port_admits_the_callers_the_docs_name() -> None:
    cidr = ["--set", "networkPolicy.apiServerCIDRs={10.0.0.10/32}"]
    only = ["--set", "networkPolicy.jobNamespaceSelector.matchLabels.team=rl"]
    rules = _rules(render(*ON, *cidr, *only, "--set", "agent.llmd.listen=0.0.0.0:50052"))

    def pods(name: str) -> dict[str, Any]:
        return {"podSelector": {"matchLabels": {"app.kubernetes.io/name": name}}}

    api_server = {"ipBlock": {"cidr": "10.0.0.10/32"}}
    jobs = {"namespaceSelector": {"matchLabels": {"team": "rl"}}}
    assert rules["baton-extender"][9462] == [pods("baton-scheduler"), PROMETHEUS, api_server]
    assert rules["baton-agent"][9460] == [PROMETHEUS, api_server]
    assert rules["baton-agent"][9464] == [pods("baton-coordinator")]
    assert rules["baton-agent"][50052] == [jobs]
    assert rules["baton-coordinator"][50051] == [jobs, pods("baton-agent")]
    assert rules["baton-coordinator"][9465] == [PROMETHEUS, api_server]  # kubectl baton jobs


def test_off_by_default() -> None:
    assert not [o for o in render() if o["kind"] == "NetworkPolicy"]

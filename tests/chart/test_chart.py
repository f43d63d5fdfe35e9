"""The chart as Helm itself checks it: `helm lint --strict`, `helm template` of every documented
values set, the schema refusing bad values by name, and the choices made from capabilities."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chart.helm import CHART, helm, refused, render

VALUES_SETS = sorted((CHART / "ci").glob("*-values.yaml"))


def kinds(objs: list[dict]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for obj in objs:
        found.setdefault(obj["kind"], set()).add(obj["metadata"]["name"])
    return found


@pytest.mark.parametrize("values", [None, *VALUES_SETS], ids=lambda p: p.name if p else "default")
def test_lint_strict(values: Path | None) -> None:
    args = ["-f", str(values)] if values else []
    done = helm("lint", "--strict", str(CHART), *args)
    assert "0 chart(s) failed" in done.stdout


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("agent.queuePolicy=roundrobin", "/agent/queuePolicy"),
        ("gpu.backend=amd", "/gpu/backend"),
        ("kubeletPlugin=cdi", "/kubeletPlugin"),
        ("agent.parking={cuda,swap}", "/agent/parking/1"),
        ("agent.fairness.minShare=lots", "/agent/fairness/minShare"),
        # --set gives a decimal as a string: the range holds for it too
        ("agent.fairness.minShare=0.9", "/agent/fairness/minShare"),
        ("agent.fairness.creditSeconds=-0.5", "/agent/fairness/creditSeconds"),
        ("agent.maxHoldSeconds=-0.5", "/agent/maxHoldSeconds"),
        ("agent.maxHoldSeconds=0", "/agent/maxHoldSeconds"),
        ("agent.forgetDepartedAfterSeconds=-1", "/agent/forgetDepartedAfterSeconds"),
        ("agent.forgetDepartedAfterSeconds=never", "/agent/forgetDepartedAfterSeconds"),
        ("hostMemoryBudgetMiB=-1", "/hostMemoryBudgetMiB"),
        ("extender.policy=random", "/extender/policy"),
        ("gpu.simulated.gpus=two", "/gpu/simulated/gpus"),
        ("agent.llmd.listen=50051", "/agent/llmd/listen"),
        ("agent.queuepolicy=fair", "queuepolicy"),
    ],
)
def test_schema_refuses_a_bad_value_naming_it(setting: str, named: str) -> None:
    said = refused("--set", setting)
    assert named in said, said


def test_schema_takes_the_documented_settings() -> None:
    settings = [
        "agent.queuePolicy=fair",
        "agent.fairness.minShare=0.5",
        "agent.fairness.tierGraceSeconds=5",
        "agent.maxHoldSeconds=30.0",
        "agent.forgetDepartedAfterSeconds=0",
        "agent.parking={cuda,app}",
        "hostMemoryBudgetMiB=262144",
        "agent.llmd.listen=0.0.0.0:50051",
        "extender.policy=spread",
    ]
    objs = render(*[arg for s in settings for arg in ("--set", s)])
    (agent,) = [
        o for o in objs if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "baton-agent"
    ]
    env = {
        e["name"]: e.get("value") for e in agent["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["BATON_AGENT_QUEUE_POLICY"] == "fair"
    assert env["BATON_AGENT_FAIR_MIN_SHARE"] == "0.5"  # the range's ends are in it
    assert env["BATON_AGENT_MAX_HOLD"] == "30.0"
    assert env["BATON_AGENT_FORGET_DEPARTED_AFTER"] == "0"  # 0 is a choice: never fold
    assert env["BATON_AGENT_TIER_GRACE"] == "5"
    assert env["BATON_AGENT_BACKEND"] == "cuda,app"
    assert env["BATON_HOST_MEMORY_BUDGET"] == "262144"
    assert env["BATON_AGENT_LLMD_LISTEN"] == "0.0.0.0:50051"


def test_auto_takes_the_dra_path_where_the_api_serves_it() -> None:
    """Helm's offline capabilities include resource.k8s.io/v1 (its client speaks 1.35)."""
    found = kinds(render("--api-versions", "resource.k8s.io/v1"))
    assert "baton-dra" in found["DaemonSet"] and "baton-deviceplugin" not in found["DaemonSet"]
    assert found["DeviceClass"] == {"gpu.baton.dev"}
    pinned = kinds(render("--set", "kubeletPlugin=deviceplugin"))
    assert "baton-deviceplugin" in pinned["DaemonSet"] and "DeviceClass" not in pinned


def test_monitors_only_where_the_operator_crds_are_served() -> None:
    assert "ServiceMonitor" not in kinds(render())
    found = kinds(render("--api-versions", "monitoring.coreos.com/v1"))
    assert found["ServiceMonitor"] == {"baton-extender"}
    assert found["PodMonitor"] == {"baton-agent", "baton-dra"}
    dashboard = [o for o in render() if o["metadata"]["name"] == "baton-grafana-dashboard"]
    assert dashboard[0]["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_helm_test_pod_asks_for_a_turn() -> None:
    (pod,) = [o for o in render() if o["kind"] == "Pod"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["schedulerName"] == "baton-scheduler"
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["limits"] == {"baton.dev/gpu": 1}
    assert "acquire" in container["command"][-1] and "yield_" in container["command"][-1]


def test_the_parking_values_are_the_methods_a_node_parks_any_tenant_with() -> None:
    """`agent.parking` offers every method of the agent's table that parks a plain tenant
    (`agent.parking.methods.PLAIN` but `none`, which the empty list stands for): a new method
    shows up here or this fails."""
    import json

    from agent.parking.methods import NONE, PLAIN

    schema = json.loads((CHART / "values.schema.json").read_text())
    enum = schema["properties"]["agent"]["properties"]["parking"]["items"]["enum"]
    assert sorted(enum) == sorted(m for m in PLAIN if m != NONE)

"""A value left empty in a values file (`scale:`, or a section whose keys are all commented out)
is YAML null, which Helm takes as "drop the chart's default": the chart either refuses it naming
the value or, where null means empty, renders as for an empty list or map."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.helm import CHART, NAMESPACE, helm

DEFAULTS = yaml.safe_load((CHART / "values.yaml").read_text())
NULL_IS_EMPTY = {
    "nodeSelector",
    "tolerations",
    "agent.parking",
    "agent.resources",
    "devicePlugin.resources",
    "dra.resources",
    "extender.resources",
    "coordinator.resources",
    "scheduler.resources",
    "monitoring.dashboard.labels",
    "networkPolicy.prometheus.namespaceSelector",
    "networkPolicy.prometheus.podSelector",
    "networkPolicy.apiServerCIDRs",
    "networkPolicy.jobNamespaceSelector",
}
"""Lists and free-form maps: null is none of them (a null namespaceSelector: the release's
own namespace)."""
EXERCISED = {
    "gpu": {"backend": "simulated"},
    "networkPolicy": {"enabled": True},
    "monitoring": {"monitors": True},
}
"""Beside the null, so that the templates reading the optional values run."""


def paths(values: dict[str, Any], above: str = "") -> Iterator[str]:
    """Every value values.yaml sets, sections and what they hold, free-form maps whole."""
    for key, value in values.items():
        path = f"{above}.{key}" if above else key
        yield path
        if isinstance(value, dict) and path not in NULL_IS_EMPTY:
            yield from paths(value, path)


def nulled(path: str) -> dict[str, Any]:
    """EXERCISED with the value at `path` null."""
    values = yaml.safe_load(yaml.safe_dump(EXERCISED))
    *above, last = path.split(".")
    node = values
    for key in above:
        node = node.setdefault(key, {})
    node[last] = None
    return dict(values)


def render_nulled(path: str, tmp_path: Path) -> tuple[int, str, str]:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(nulled(path)))
    done = helm("template", "baton", str(CHART), "-n", NAMESPACE, "-f", str(values), check=False)
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize("path", sorted(set(paths(DEFAULTS)) - NULL_IS_EMPTY))
def test_a_value_left_null_is_refused_naming_it(path: str, tmp_path: Path) -> None:
    """Before, a null section failed with a template error ("nil pointer evaluating interface
    {}.minShare"), a null scalar rendered "<nil>" (BATON_FAKE_SCALE, which the agent refuses at
    start) or nothing (`helm test`'s `acquire(timeout=)`; `kubeletPlugin:` no kubelet plugin)."""
    code, _out, said = render_nulled(path, tmp_path)
    *above, last = path.split(".")
    assert code != 0, f"{path}: null was taken"
    where = "".join(f"/{key}" for key in above)
    assert f"at '{where}': missing property '{last}'" in said, said


@pytest.mark.parametrize("path", sorted(NULL_IS_EMPTY))
def test_a_list_or_map_left_null_is_empty(path: str, tmp_path: Path) -> None:
    code, out, said = render_nulled(path, tmp_path)
    assert code == 0, said
    assert "<nil>" not in out
    for policy in [o for o in yaml.safe_load_all(out) if o and o["kind"] == "NetworkPolicy"]:
        for rule in policy["spec"]["ingress"]:
            for peer in rule["from"]:  # a peer that selects nothing is refused by the API
                assert any(v is not None for v in peer.values()), (policy, peer)

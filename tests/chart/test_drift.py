"""One source of truth: the chart renders, for each documented values set in charts/baton/ci,
the same objects as the kustomize build it names (manifests/ is the reference)."""

from __future__ import annotations

import difflib

import pytest
import yaml

from tests.chart.helm import CHART, NAMESPACE, comparable, kustomize, render

PAIRS = {
    "base": (".",),
    "nvidia": ("overlays/nvidia",),
    "dra": ("overlays/dra",),
    "kind": ("overlays/kind",),
    "local": ("overlays/local",),
    "local-dra": ("overlays/local-dra",),
    "monitoring": (".", "overlays/monitoring"),
}

KUBE_VERSION = {"dra": "1.36.2", "local-dra": "1.36.2"}
"""The API server each render stands for (else 1.32.2): the chart's kube-scheduler follows the
API server's version, the kustomize builds pin the one of such a server (v1.32.2, DRA v1.36.2)."""

CHART_ONLY = {("Secret", NAMESPACE, "baton-coordination")}
"""What the chart makes and kustomize leaves to the operator: the coordination token's Secret,
which the chart keeps across upgrades and kustomize cannot make at random (the comment in
manifests/base/kustomization.yaml says how to make it)."""


def test_every_values_set_has_its_kustomize_build() -> None:
    documented = {p.name.removesuffix("-values.yaml") for p in (CHART / "ci").glob("*.yaml")}
    assert documented == set(PAIRS)


KUSTOMIZE_ONLY = {"monitoring": {("PodMonitor", NAMESPACE, "baton-dra")}}
"""What an overlay holds for either kubelet path: the monitoring overlay goes beside the device
plugin's install or the DRA driver's, so it monitors both; the chart renders its own path's."""


@pytest.mark.parametrize("values", sorted(PAIRS))
def test_chart_renders_what_kustomize_builds(values: str) -> None:
    server = KUBE_VERSION.get(values, "1.32.2")
    args = [
        "--skip-tests",
        "--kube-version",
        server,
        "-f",
        str(CHART / "ci" / f"{values}-values.yaml"),
    ]
    chart = comparable(render(*args))
    for key in CHART_ONLY & chart.keys():
        del chart[key]
    manifests = comparable(kustomize(*PAIRS[values]))
    for key in KUSTOMIZE_ONLY.get(values, set()):
        del manifests[key]
    assert sorted(chart) == sorted(manifests), "the two install different objects"
    for key, obj in manifests.items():
        if chart[key] != obj:
            diff = difflib.unified_diff(
                yaml.safe_dump(obj).splitlines(),
                yaml.safe_dump(chart[key]).splitlines(),
                "kustomize",
                "helm",
                lineterm="",
            )
            raise AssertionError(f"{key} differs:\n" + "\n".join(diff))

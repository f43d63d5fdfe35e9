"""Helm and kustomize as the chart tests run them: render, decode, and reduce to comparable
objects."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from commands.localnode.binaries import find_helm, search_dirs

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "baton"
MANIFESTS = ROOT / "manifests"
NAMESPACE = "baton-system"
Obj = dict[str, Any]
Key = tuple[str, str, str]

HELM_LABELS = {
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "helm.sh/chart",
    # The chart labels every object part-of=baton; the kustomize base does, its DRA driver
    # objects do not. Selectors keep it wherever kustomize puts it (they are compared).
    "app.kubernetes.io/part-of",
}
"""Labels of an object's own metadata the comparison leaves out."""
HASH_SUFFIX = re.compile(r"^(baton-scheduler-config)-[a-z0-9]{10}$")
"""kustomize's generated ConfigMap names; the chart restarts on a checksum annotation instead."""


def helm_binary() -> Path:
    """Helm from the Kubernetes binaries' directory; skips (CI fails on it) when there is none."""
    found = find_helm()
    if found is None:
        where = ", ".join(str(d) for d in search_dirs())
        pytest.skip(f"needs Kubernetes binaries (helm-v*-linux-amd64.xz in {where})")
    return found


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run helm; the completed process (CalledProcessError with its output when `check`)."""
    done = subprocess.run(
        [str(helm_binary()), *args], capture_output=True, text=True, timeout=120, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done


def refused(*args: str) -> str:
    """What `helm template` of the chart with `args` says on stderr; it must refuse them."""
    done = helm("template", "baton", str(CHART), *args, check=False)
    assert done.returncode != 0, f"{' '.join(args)} was accepted"
    return done.stderr


def render(*args: str) -> list[Obj]:
    """`helm template baton charts/baton -n baton-system ARGS...`, decoded."""
    out = helm("template", "baton", str(CHART), "-n", NAMESPACE, *args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def kustomize(*overlays: str) -> list[Obj]:
    """`kubectl kustomize` of each overlay (relative to manifests/), decoded and concatenated."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("needs system package kubernetes-client")
    docs: list[Obj] = []
    for overlay in overlays:
        out = subprocess.run(
            [kubectl, "kustomize", str(MANIFESTS / overlay)],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        docs += [doc for doc in yaml.safe_load_all(out) if doc]
    return docs


def key(obj: Obj) -> Key:
    meta = obj["metadata"]
    name = HASH_SUFFIX.sub(r"\1", meta["name"])
    return obj["kind"], meta.get("namespace", ""), name


def comparable(objs: list[Obj]) -> dict[Key, Obj]:
    """Objects by (kind, namespace, name), reduced to what both tools must agree on."""
    return {key(obj): _normal(obj) for obj in objs if obj["kind"] != "Namespace"}


def _normal(obj: Obj) -> Obj:
    obj = _sorted(obj)
    labels = obj["metadata"].get("labels", {})
    for label in HELM_LABELS:
        labels.pop(label, None)
    if not labels:
        obj["metadata"].pop("labels", None)
    obj["metadata"]["name"] = key(obj)[2]
    if obj["kind"] == "ConfigMap" and "config.yaml" in obj.get("data", {}):
        obj["data"]["config.yaml"] = yaml.safe_load(obj["data"]["config.yaml"])
    if obj["kind"] == "ConfigMap" and "baton.json" in obj.get("data", {}):
        obj["data"]["baton.json"] = obj["data"]["baton.json"].strip()
    template = obj.get("spec", {}).get("template", {})
    annotations = template.get("metadata", {}).get("annotations", {})
    for name in [a for a in annotations if a.startswith("checksum/")]:
        del annotations[name]
    if "annotations" in template.get("metadata", {}) and not annotations:
        del template["metadata"]["annotations"]
    for volume in template.get("spec", {}).get("volumes", []):
        if "configMap" in volume:
            volume["configMap"]["name"] = HASH_SUFFIX.sub(r"\1", volume["configMap"]["name"])
    return obj


def _sorted(value: Any) -> Any:
    """Lists of named items (env, volumes, mounts, containers) in name order: order carries no
    meaning there, and kustomize appends what an overlay adds."""
    if isinstance(value, dict):
        return {k: _sorted(v) for k, v in value.items()}
    if isinstance(value, list):
        items = [_sorted(v) for v in value]
        if items and all(isinstance(v, dict) and "name" in v for v in items):
            items.sort(key=lambda v: str(v["name"]))
        return items
    return value

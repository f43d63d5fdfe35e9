"""The overlays as `kubectl kustomize` builds them: what each changes of the base install (kind's
simulated GPUs, NVIDIA's runtime, monitoring's scrapes, the DRA driver) and the example job's
image in each."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from baton.contract import names
from tests.test_manifests import MANIFESTS, build, by_kind, containers, env_names, kubectl


@pytest.mark.parametrize(
    ("overlay", "image"),
    [
        ("examples", "baton-tenant:0.1.0"),
        ("overlays/local-examples", "baton-tenant:local"),
        # kind's example tenants allocate simulated device memory: the daemons' image has it
        ("overlays/kind-examples", "baton:dev"),
    ],
)
def test_the_example_job_runs_in_the_tenant_image(overlay: str, image: str) -> None:
    job = by_kind(build(overlay), "Job")["grpo-tenant"]
    assert containers(job)["trainer"]["image"] == image


def test_kind_overlay_runs_fake_gpus_unprivileged() -> None:
    daemonsets = by_kind(build("overlays/kind"), "DaemonSet")
    agent = containers(daemonsets["baton-agent"])["agent"]
    assert agent["securityContext"]["privileged"] is False
    assert agent["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    for workload in daemonsets.values():
        assert {c["image"] for c in containers(workload).values()} == {"baton:dev"}
        assert "runtimeClassName" not in workload["spec"]["template"]["spec"]
    plugin = containers(daemonsets["baton-deviceplugin"])["deviceplugin"]
    assert {"BATON_FAKE_GPUS", "BATON_HOST_MEMORY_BUDGET", names.ENV_NODE_NAME} <= env_names(plugin)
    assert names.ENV_NODE_NAME in env_names(agent)
    fake_gpus = [
        next(e["value"] for e in c["env"] if e["name"] == names.ENV_FAKE_GPUS)
        for c in (plugin, agent)
    ]
    assert fake_gpus[0] == fake_gpus[1], "the device plugin and the agent must name the same GPUs"


def test_nvidia_overlay_uses_the_nvidia_runtime() -> None:
    daemonsets = by_kind(build("overlays/nvidia"), "DaemonSet")
    assert set(daemonsets) == {"baton-agent", "baton-deviceplugin"}
    for workload in daemonsets.values():
        pod = workload["spec"]["template"]["spec"]
        assert pod["runtimeClassName"] == "nvidia"
        assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    agent = containers(daemonsets["baton-agent"])["agent"]
    assert {"name": "BATON_AGENT_BACKEND", "value": "cuda"} in agent["env"]


def test_monitoring_overlay_has_scrapes_and_the_dashboard() -> None:
    objects = build("overlays/monitoring")
    monitors = by_kind(objects, "PodMonitor")
    assert set(monitors) == {"baton-agent", "baton-deviceplugin", "baton-dra", "baton-coordinator"}
    base, dra = build("."), build("overlays/dra")  # the driver's pods come with the DRA overlay
    workloads = {**by_kind(base, "DaemonSet"), **by_kind(base, "Deployment")}
    workloads["baton-dra"] = by_kind(dra, "DaemonSet")["baton-dra"]
    for name, monitor in monitors.items():
        pods = workloads[name]["spec"]["template"]
        assert (
            monitor["spec"]["selector"]["matchLabels"].items() <= pods["metadata"]["labels"].items()
        )
        ports = {p["name"] for c in pods["spec"]["containers"] for p in c["ports"]}
        ports.discard("coordination")  # the agent's job turns for the coordinator: frames on TCP
        ports.discard("llmd")  # the coordinator's llm-d orchestrator API: gRPC
        assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} == ports
    assert set(by_kind(objects, "ServiceMonitor")) == {"baton-extender"}
    (dashboard,) = by_kind(objects, "ConfigMap").values()
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert yaml.safe_load(dashboard["data"]["baton.json"])["title"]


def test_dra_overlay_swaps_the_device_plugin_for_the_driver() -> None:
    objects = build("overlays/dra")
    assert set(by_kind(objects, "DaemonSet")) == {"baton-agent", "baton-dra"}
    driver = by_kind(objects, "DaemonSet")["baton-dra"]
    assert containers(driver)["dra"]["args"] == ["dra"]
    assert driver["spec"]["template"]["spec"]["serviceAccountName"] in by_kind(
        objects, "ServiceAccount"
    )
    (device_class,) = by_kind(objects, "DeviceClass").values()
    assert device_class["metadata"]["name"] == names.DRA_DEVICE_CLASS
    assert device_class["spec"]["extendedResourceName"] == names.RESOURCE_GPU
    rules = by_kind(objects, "ClusterRole")["baton-dra"]["rules"]
    assert {r for rule in rules for r in rule["resources"]} == {
        "resourceslices",
        "resourceclaims",
        "nodes",
    }
    agent_rules = by_kind(objects, "ClusterRole")["baton-agent-dra"]["rules"]
    assert {(r, v) for rule in agent_rules for r in rule["resources"] for v in rule["verbs"]} == {
        ("resourceclaims", "get"),
        ("resourceslices", "list"),
    }
    (binding,) = [
        b
        for b in by_kind(objects, "ClusterRoleBinding").values()
        if b["roleRef"]["name"] == "baton-agent-dra"
    ]
    assert binding["subjects"][0]["name"] == "baton-agent"
    configmaps = by_kind(objects, "ConfigMap")
    (config,) = [c for n, c in configmaps.items() if n.startswith("baton-scheduler-config")]
    assert "bindVerb" not in config["data"]["config.yaml"], "the scheduler binds on DRA"
    (extender,) = yaml.safe_load(config["data"]["config.yaml"])["extenders"]
    # No managedResources: every pod of the profile is sent, claim-only pods too.
    assert set(extender) == {
        "urlPrefix",
        "filterVerb",
        "prioritizeVerb",
        "weight",
        "nodeCacheCapable",
        "httpTimeout",
        "ignorable",
    }
    assert extender["ignorable"] is False and extender["nodeCacheCapable"] is True
    env = containers(by_kind(objects, "Deployment")["baton-extender"])["extender"]["env"]
    assert {"name": "BATON_EXTENDER_DRA", "value": "true"} in env
    (watch,) = [
        b
        for b in by_kind(objects, "ClusterRoleBinding").values()
        if b["roleRef"]["name"] == "baton-extender-dra"
    ]
    assert watch["subjects"][0]["name"] == "baton-extender"


def test_local_dra_overlay_runs_the_driver_on_the_local_node() -> None:
    objects = build("overlays/local-dra")
    daemonsets = by_kind(objects, "DaemonSet")
    assert set(daemonsets) == {"baton-agent", "baton-dra"}
    driver = daemonsets["baton-dra"]["spec"]["template"]["spec"]
    assert driver["hostNetwork"] is True
    (container,) = driver["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    agent = containers(daemonsets["baton-agent"])["agent"]
    agent_env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env[names.ENV_FAKE_GPUS] == agent_env[names.ENV_FAKE_GPUS], "the same simulated GPUs"
    assert container["image"] == "baton:local" and container["imagePullPolicy"] == "Never"
    assert "baton-agent-dra" in by_kind(objects, "ClusterRole")


def _set_image(kustomization: Path, name: str, new_name: str, new_tag: str) -> None:
    """As `kustomize edit set image NAME=NEW_NAME:NEW_TAG` run beside `kustomization`."""
    spec = yaml.safe_load(kustomization.read_text())
    images = spec.setdefault("images", [])
    entry = next((i for i in images if i["name"] == name), None)
    if entry is None:
        images.append(entry := {"name": name})
    entry.update(newName=new_name, newTag=new_tag)
    kustomization.write_text(yaml.safe_dump(spec))


@pytest.mark.parametrize("overlay", [".", "overlays/nvidia", "overlays/dra"])
def test_an_image_set_in_the_applied_kustomization_reaches_every_daemon(
    overlay: str, tmp_path: Path
) -> None:
    """docs/deploy.md: `kustomize edit set image baton=<registry>/baton:<tag>` in the
    kustomization you apply points every Baton container at your registry, the DRA driver
    (which overlays/dra adds beside the base, out of the base's reach) included."""
    copy = tmp_path / "manifests"
    shutil.copytree(MANIFESTS, copy)
    _set_image(copy / overlay / "kustomization.yaml", "baton", "registry.example/baton", "9.9")
    rendered = subprocess.run(
        [kubectl(), "kustomize", str(copy / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    objects = [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]
    images = {
        f"{name}/{container}": c["image"]
        for kind in ("Deployment", "DaemonSet")
        for name, workload in by_kind(objects, kind).items()
        for container, c in containers(workload).items()
        if container != "kube-scheduler"
    }
    assert "baton-agent/agent" in images
    wrong = {k: v for k, v in images.items() if v != "registry.example/baton:9.9"}
    assert not wrong, f"not from the registry set in manifests/{overlay}: {wrong}"

"""The Kubernetes manifests, the Dockerfile and the hack/ scripts.

Without kubectl these tests parse every YAML file and follow every kustomization reference; with
kubectl (Debian's kubernetes-client package, or any newer kubectl) they also build each
kustomization with its embedded kustomize and check the rendered objects (each overlay's own
changes in `test_manifests_overlays.py`).
"""

from __future__ import annotations

import fnmatch
import functools
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml

import commands.cli
from baton.contract import names

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = ROOT / "manifests"
BUILDS = [
    ".",
    "overlays/kind",
    "overlays/nvidia",
    "overlays/monitoring",
    "overlays/kind-examples",
    "overlays/local",
    "overlays/local-examples",
    "overlays/dra",
    "overlays/local-dra",
]
REFERENCE_FIELDS = ("resources", "bases", "patchesStrategicMerge", "components")
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "DeviceClass"}
Obj = dict[str, Any]


def load_all(path: Path) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def kustomizations() -> list[Path]:
    return sorted(MANIFESTS.rglob("kustomization.yaml"))


def object_files() -> list[Path]:
    return [
        p
        for p in sorted(MANIFESTS.rglob("*.yaml"))
        if p.name != "kustomization.yaml" and "scheduler" not in p.relative_to(MANIFESTS).parts
    ]


def base_object(kind: str, name: str) -> Obj:
    for path in sorted((MANIFESTS / "base").glob("*.yaml")):
        for doc in load_all(path):
            if doc.get("kind") == kind and doc["metadata"]["name"] == name:
                return doc
    raise AssertionError(f"no {kind} {name} in manifests/base")


def containers(workload: Obj) -> dict[str, Obj]:
    return {c["name"]: c for c in workload["spec"]["template"]["spec"]["containers"]}


def env_names(container: Obj) -> set[str]:
    return {e["name"] for e in container.get("env", [])}


@pytest.mark.parametrize("kustomization", kustomizations(), ids=lambda p: str(p.parent.name))
def test_kustomization_references_exist(kustomization: Path) -> None:
    spec = yaml.safe_load(kustomization.read_text())
    for field in REFERENCE_FIELDS:
        for ref in spec.get(field) or []:
            target = (kustomization.parent / ref).resolve()
            assert target.exists(), f"{kustomization}: {field} {ref} does not exist"
            if target.is_dir():
                assert (target / "kustomization.yaml").exists(), f"{ref} is not a kustomization"
            else:
                assert target.is_relative_to(kustomization.parent), f"{ref} is outside its root"
    for generator in spec.get("configMapGenerator") or []:
        for entry in generator.get("files") or []:
            assert (kustomization.parent / entry.split("=")[-1]).is_file(), entry


@pytest.mark.parametrize("path", object_files(), ids=lambda p: str(p.relative_to(MANIFESTS)))
def test_objects_are_well_formed(path: Path) -> None:
    for doc in load_all(path):
        assert {"apiVersion", "kind", "metadata"} <= doc.keys(), path
        meta = doc["metadata"]
        assert meta.get("name"), f"{path}: an object without a name"
        if doc["kind"] not in CLUSTER_SCOPED:
            assert meta.get("namespace") in (names.NAMESPACE, "kube-system", "baton-demo"), (
                f"{path}: {doc['kind']} {meta['name']} names no Baton namespace"
            )


def host_paths(workload: Obj) -> dict[str, str]:
    """Volume name → host path, for every hostPath volume of a workload."""
    volumes = workload["spec"]["template"]["spec"]["volumes"]
    return {v["name"]: v["hostPath"]["path"] for v in volumes if "hostPath" in v}


def test_host_pid_and_privileges_belong_to_the_agent_only() -> None:
    agent = base_object("DaemonSet", "baton-agent")
    plugin = base_object("DaemonSet", "baton-deviceplugin")
    assert set(containers(agent)) == {"agent"} and set(containers(plugin)) == {"deviceplugin"}
    assert agent["spec"]["template"]["spec"]["hostPID"] is True
    assert containers(agent)["agent"]["securityContext"]["privileged"] is True
    plugin_pod = plugin["spec"]["template"]["spec"]
    for field in ("hostPID", "hostNetwork", "hostIPC"):
        assert field not in plugin_pod, f"the device plugin's pod sets {field}"
    context = containers(plugin)["deviceplugin"]["securityContext"]
    assert not context.get("privileged") and context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["readOnlyRootFilesystem"] is True
    for workload, account in ((agent, "baton-agent"), (plugin, "baton-deviceplugin")):
        pod = workload["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == account
        assert pod["nodeSelector"] == {names.LABEL_GPU_NODE: "true"}
        (container,) = containers(workload).values()
        assert container["resources"]["requests"], container["name"]
        node_name = next(e for e in container["env"] if e["name"] == "NODE_NAME")
        assert node_name["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_node_daemonsets_mounts_and_ports_match_names() -> None:
    agent = base_object("DaemonSet", "baton-agent")
    plugin = base_object("DaemonSet", "baton-deviceplugin")
    assert sorted(host_paths(agent).values()) == [names.AGENT_SOCKET_DIR, names.AGENT_STATE_DIR]
    assert sorted(host_paths(plugin).values()) == [
        names.AGENT_SOCKET_DIR,
        names.KUBELET_DEVICE_PLUGIN_DIR,
        names.KUBELET_POD_RESOURCES_DIR,
    ]
    for workload, container, ports in (
        (agent, "agent", [names.PORT_AGENT, names.PORT_AGENT_COORDINATION]),
        (plugin, "deviceplugin", [names.PORT_DEVICE_PLUGIN]),
    ):
        part = containers(workload)[container]
        assert [p["containerPort"] for p in part["ports"]] == ports
        volumes = host_paths(workload)
        for mount in part["volumeMounts"]:
            if mount["name"] not in volumes:
                continue  # the coordination token's Secret (test_coordinator_wiring)
            assert mount["mountPath"] == volumes[mount["name"]], "host and container paths differ"
            if workload is plugin and mount["mountPath"] == names.AGENT_SOCKET_DIR:
                assert mount["readOnly"] is True, "the device plugin only hands the socket out"


def test_status_selector_picks_the_agent_pods() -> None:
    key, _, value = names.NODE_POD_SELECTOR.partition("=")
    for name in ("baton-agent", "baton-deviceplugin"):
        workload = base_object("DaemonSet", name)
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert (labels.get(key) == value) is (name == "baton-agent"), name
        assert workload["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_extender_and_scheduler_wiring() -> None:
    extender = base_object("Deployment", "baton-extender")
    service = base_object("Service", "baton-extender")
    assert containers(extender)["extender"]["ports"][0]["containerPort"] == names.PORT_EXTENDER
    assert service["spec"]["ports"][0]["port"] == names.PORT_EXTENDER
    scheduler = base_object("Deployment", "baton-scheduler")
    command = containers(scheduler)["kube-scheduler"]["command"]
    assert command[0] == "kube-scheduler"
    assert f"--leader-elect-resource-name={names.SCHEDULER_NAME}" in command
    assert f"--leader-elect-resource-namespace={names.NAMESPACE}" in command
    assert containers(scheduler)["kube-scheduler"]["image"].startswith("registry.k8s.io/")


def test_example_tenant_asks_for_baton_resources() -> None:
    (job,) = [d for d in load_all(MANIFESTS / "examples" / "grpo-job.yaml") if d["kind"] == "Job"]
    pod = job["spec"]["template"]["spec"]
    assert pod["schedulerName"] == names.SCHEDULER_NAME
    limits = pod["containers"][0]["resources"]["limits"]
    assert {names.RESOURCE_GPU, names.RESOURCE_GPU_MEMORY, names.RESOURCE_GPU_DUTY} <= set(limits)
    assert pod["containers"][0]["command"] == ["python", "-m", "agent.examples.grpo_loop"]


def _options(command: str) -> set[str]:
    group = typer.main.get_command(commands.cli.app)
    assert isinstance(group, typer.main.TyperGroup)
    cmd = group.commands.get(command)
    assert cmd is not None, f"`baton {command}` is not registered"
    env: set[str] = set()
    for param in cmd.params:
        envvar = getattr(param, "envvar", None)
        env.update([envvar] if isinstance(envvar, str) else envvar or [])
    return env


def _overlay_patches() -> list[Path]:
    return [p for p in object_files() if "overlays" in p.parts]


def test_daemon_env_vars_are_flags_of_their_commands() -> None:
    """Every BATON_* (and NODE_NAME) variable set on a daemon is read by its `baton` command."""
    workloads = [
        base_object("DaemonSet", "baton-agent"),
        base_object("DaemonSet", "baton-deviceplugin"),
        base_object("Deployment", "baton-extender"),
        base_object("Deployment", "baton-coordinator"),
        *load_all(MANIFESTS / "overlays" / "dra" / "driver" / "dra.yaml"),
    ]
    base_commands = {name: c["args"][0] for w in workloads for name, c in containers(w).items()}
    base = [
        MANIFESTS / "base" / f"{name}.yaml" for name in ("agent", "deviceplugin", "coordinator")
    ]
    for path in [*base, *_overlay_patches()]:
        for doc in load_all(path):
            if doc["kind"] not in ("DaemonSet", "Deployment") or "spec" not in doc:
                continue  # a `$patch: delete` has no spec
            for name, container in containers(doc).items():
                if name == "kube-scheduler":  # the local overlay's patch of baton-scheduler
                    continue
                command = base_commands.get(name) or container["args"][0]
                read = _options(command)
                for var in env_names(container):
                    if var.startswith("BATON_") or var == "NODE_NAME":
                        assert var in read, f"{path.name}: `baton {command}` does not read {var}"


def test_dockerfile_copies_every_package_and_ignores_nothing_it_needs() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    copied = {
        src
        for line in re.findall(r"^COPY (?!--from)(.+)$", dockerfile, re.M)
        for src in line.split()[:-1]
    }
    packages = {"baton", "agent", "deviceplugin", "dra", "nodegpu", "extender", "commands"}
    assert packages | {"pyproject.toml", "README.md"} <= copied
    assert re.search(r'^ENTRYPOINT \["baton"\]$', dockerfile, re.M)
    patterns = [p for p in (ROOT / ".dockerignore").read_text().splitlines() if p and p[0] != "#"]
    for src in copied:
        included = False
        for pattern in patterns:
            negated = pattern.startswith("!")
            if fnmatch.fnmatch(src, pattern.lstrip("!").rstrip("/")) or pattern == "**":
                included = negated
        assert included, f".dockerignore leaves {src} out of the build context"


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.skip("needs system package kubernetes-client (kubectl, for `kubectl kustomize`)")
    return path


@functools.cache
def _rendered(overlay: str) -> str:
    result = subprocess.run(
        [kubectl(), "kustomize", str(MANIFESTS / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def build(overlay: str) -> list[Obj]:
    """The objects `kubectl kustomize` renders for manifests/<overlay>."""
    return [doc for doc in yaml.safe_load_all(_rendered(overlay)) if doc]


def by_kind(objects: list[Obj], kind: str) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


@pytest.mark.parametrize("overlay", BUILDS)
def test_kustomize_builds(overlay: str) -> None:
    objects = build(overlay)
    assert objects
    keys = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects]
    assert len(keys) == len(set(keys)), "duplicate objects"


@pytest.mark.parametrize("overlay", [".", "overlays/kind", "overlays/nvidia"])
def test_built_install_is_complete(overlay: str) -> None:
    objects = build(overlay)
    assert set(by_kind(objects, "Deployment")) == {
        "baton-extender",
        "baton-scheduler",
        "baton-coordinator",
    }
    assert set(by_kind(objects, "DaemonSet")) == {"baton-agent", "baton-deviceplugin"}
    assert [n for n, d in by_kind(objects, "DaemonSet").items() if _host_pid(d)] == ["baton-agent"]
    configmaps = by_kind(objects, "ConfigMap")
    scheduler = by_kind(objects, "Deployment")["baton-scheduler"]
    (volume,) = scheduler["spec"]["template"]["spec"]["volumes"]
    config = configmaps[volume["configMap"]["name"]]
    flag = next(a for a in containers(scheduler)["kube-scheduler"]["command"] if "--config=" in a)
    assert Path(flag.split("=", 1)[1]).name in config["data"], "the --config file is not mounted"
    for workload in [
        *by_kind(objects, "Deployment").values(),
        *by_kind(objects, "DaemonSet").values(),
    ]:
        for container in containers(workload).values():
            assert ":" in container["image"], f"{container['name']} has an untagged image"
        account = workload["spec"]["template"]["spec"]["serviceAccountName"]
        assert account in by_kind(objects, "ServiceAccount"), f"no ServiceAccount {account}"


def _host_pid(workload: Obj) -> bool:
    return bool(workload["spec"]["template"]["spec"].get("hostPID"))


def test_hack_scripts_pass_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("needs system package shellcheck")
    scripts = sorted(str(p) for p in (ROOT / "hack").glob("*.sh"))
    assert scripts
    result = subprocess.run([shellcheck, *scripts], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr

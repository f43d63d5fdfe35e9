"""The Kubernetes manifests, the Dockerfile and the hack/ scripts.

Without kubectl these tests parse every YAML file and follow every kustomization reference; with
kubectl (Debian's kubernetes-client package, or any newer kubectl) they also build each
kustomization with its embedded kustomize and check the rendered objects.
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


def _host_pid(workload: Obj) -> bool:
    return bool(workload["spec"]["template"]["spec"].get("hostPID"))


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
    assert set(monitors) == {"baton-agent", "baton-deviceplugin"}
    base = build(".")
    for name, monitor in monitors.items():
        pods = by_kind(base, "DaemonSet")[name]["spec"]["template"]
        assert (
            monitor["spec"]["selector"]["matchLabels"].items() <= pods["metadata"]["labels"].items()
        )
        ports = {p["name"] for c in pods["spec"]["containers"] for p in c["ports"]}
        ports.discard("coordination")  # the agent's job turns for the coordinator: frames on TCP
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


def test_hack_scripts_pass_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("needs system package shellcheck")
    scripts = sorted(str(p) for p in (ROOT / "hack").glob("*.sh"))
    assert scripts
    result = subprocess.run([shellcheck, *scripts], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr

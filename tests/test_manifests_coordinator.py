"""The cluster coordinator in manifests/: its Deployment, Service and budget, the agents' half of
the job turns, the token Secret both mount, and the local node's overlays without any of it."""

from __future__ import annotations

import re

import pytest

from baton.contract import names
from tests.test_manifests import BUILDS, MANIFESTS, Obj, base_object, build, by_kind, containers

TOKEN_SECRET = "baton-coordination"
LOCAL = ("overlays/local", "overlays/local-dra")
WITH_COORDINATOR = [".", "overlays/kind", "overlays/nvidia", "overlays/dra"]
"""The installs of a real cluster (monitoring and examples are applied beside one)."""


def env_of(container: Obj) -> dict[str, Obj]:
    return {e["name"]: e for e in container.get("env", [])}


def token_file(workload: Obj, container: str) -> str:
    """The path the container is told to read the token from, checked to lie in the Secret."""
    part = containers(workload)[container]
    path = env_of(part)["BATON_COORDINATION_TOKEN_FILE"]["value"]
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    (mount,) = [m for m in part["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    assert mount.get("readOnly") is True
    assert volumes[mount["name"]]["secret"]["secretName"] == TOKEN_SECRET
    return str(path.removeprefix(mount["mountPath"] + "/"))


def test_the_agents_and_the_coordinator_read_the_same_token() -> None:
    agent = base_object("DaemonSet", "baton-agent")
    coordinator = base_object("Deployment", "baton-coordinator")
    assert token_file(agent, "agent") == token_file(coordinator, "coordinator") == "token"


def test_the_token_secret_is_the_operators_and_its_command_is_documented() -> None:
    """kustomize makes no random token: the base leaves the Secret out and says how to make it."""
    assert TOKEN_SECRET not in by_kind(build("."), "Secret")
    kustomization = (MANIFESTS / "base" / "kustomization.yaml").read_text()
    assert f"create secret generic {TOKEN_SECRET} --from-literal=token=" in kustomization


def test_the_service_reaches_the_leader_on_llmds_port() -> None:
    deployment = base_object("Deployment", "baton-coordinator")
    service = base_object("Service", "baton-coordinator")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = service["spec"]["selector"]
    assert selector == {**pod_labels, names.LABEL_COORDINATOR_LEADER: "true"}
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert port["port"] == names.PORT_LLMD_ORCHESTRATOR
    ports = {p["name"]: p["containerPort"] for p in containers(deployment)["coordinator"]["ports"]}
    assert ports[port["targetPort"]] == names.PORT_LLMD_ORCHESTRATOR


def test_the_coordinator_runs_two_replicas_that_know_their_pod() -> None:
    deployment = base_object("Deployment", "baton-coordinator")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "baton-coordinator"
    (container,) = pod["containers"]
    assert container["args"] == ["coordinator"]
    env = env_of(container)
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    budget = base_object("PodDisruptionBudget", "baton-coordinator")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_a_standby_stays_ready_and_alive() -> None:
    """The gRPC health service says SERVING on the leader only: no probe may ask it (nor any
    HTTP path: the coordinator serves none), or a standby would be unready or restarted."""
    (container,) = containers(base_object("Deployment", "baton-coordinator")).values()
    for probe in ("readinessProbe", "livenessProbe"):
        assert set(container[probe]) - {"periodSeconds", "failureThreshold"} == {"tcpSocket"}
        assert container[probe]["tcpSocket"]["port"] == "llmd"
    context = container["securityContext"]
    assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"]
    assert context["capabilities"] == {"drop": ["ALL"]}


def test_the_agent_serves_job_turns_where_it_says_it_does() -> None:
    """The agent listens on its pod's address and publishes that same address (the agent pod
    has its own network: no hostNetwork)."""
    agent = base_object("DaemonSet", "baton-agent")
    assert "hostNetwork" not in agent["spec"]["template"]["spec"]
    env = env_of(containers(agent)["agent"])
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    address = f"$(POD_IP):{names.PORT_AGENT_COORDINATION}"
    assert env["BATON_AGENT_COORDINATION_LISTEN"]["value"] == address
    assert env["BATON_AGENT_COORDINATION_ADVERTISE"]["value"] == address
    service = f"baton-coordinator.{names.NAMESPACE}.svc:{names.PORT_LLMD_ORCHESTRATOR}"
    assert env["BATON_COORDINATOR"]["value"] == service


@pytest.mark.parametrize("overlay", BUILDS)
def test_env_references_name_variables_set_before_them(overlay: str) -> None:
    """Kubernetes expands `$(NAME)` only for a variable earlier in the same list."""
    for kind in ("DaemonSet", "Deployment", "Job"):
        for workload in by_kind(build(overlay), kind).values():
            for name, container in containers(workload).items():
                seen: set[str] = set()
                for var in container.get("env", []):
                    for ref in re.findall(r"\$\((\w+)\)", str(var.get("value", ""))):
                        assert ref in seen, f"{overlay}: {name}'s {var['name']} uses {ref} first"
                    seen.add(var["name"])


@pytest.mark.parametrize("overlay", WITH_COORDINATOR)
def test_every_cluster_install_has_the_coordinator(overlay: str) -> None:
    objects = build(overlay)
    assert "baton-coordinator" in by_kind(objects, "Deployment")
    assert "baton-coordinator" in by_kind(objects, "Role")
    agent = containers(by_kind(objects, "DaemonSet")["baton-agent"])["agent"]
    assert "BATON_AGENT_COORDINATION_LISTEN" in env_of(agent)


@pytest.mark.parametrize("overlay", LOCAL)
def test_the_local_node_has_no_coordinator_nor_the_agents_half(overlay: str) -> None:
    """As charts/baton/ci/local*-values.yaml: nothing of it, and the agent neither listens for
    job turns, nor mounts the Secret nobody makes there, nor may patch Nodes."""
    objects = build(overlay)
    named = [f"{o['kind']}/{o['metadata']['name']}" for o in objects]
    assert not [n for n in named if "coordinat" in n], named
    agent_set = by_kind(objects, "DaemonSet")["baton-agent"]
    agent = containers(agent_set)["agent"]
    assert not [e for e in env_of(agent) if "COORDINAT" in e or e == "POD_IP"]
    assert [p["containerPort"] for p in agent["ports"]] == [names.PORT_AGENT]
    volumes = agent_set["spec"]["template"]["spec"]["volumes"]
    assert not [v for v in volumes if "secret" in v]
    rules = by_kind(objects, "ClusterRole")["baton-agent"]["rules"]
    assert {r for rule in rules for r in rule["resources"]} == {"pods"}


def test_the_monitoring_overlay_scrapes_every_replica_on_its_metrics_port() -> None:
    monitor = by_kind(build("overlays/monitoring"), "PodMonitor")["baton-coordinator"]
    deployment = base_object("Deployment", "baton-coordinator")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert names.LABEL_COORDINATOR_LEADER not in monitor["spec"]["selector"]["matchLabels"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    ports = {p["name"]: p["containerPort"] for p in containers(deployment)["coordinator"]["ports"]}
    assert (endpoint["path"], ports.get(endpoint["port"])) == ("/metrics", names.PORT_COORDINATOR)

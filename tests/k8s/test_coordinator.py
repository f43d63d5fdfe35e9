"""The coordinator's Deployment from the manifests, on the real node, drives a two-pod job.

The local overlay leaves the coordinator out (the node has no kube-proxy for its Service); this
test installs it from the same manifests with the local overlay's own patches but that one, plus
what a node without kube-proxy or DNS needs (one replica on the host's network, the agent dialing
it on loopback), and takes it out again after. The job's pods are real pods, scheduled through
the extender and admitted by the kubelet; llm-d's client (`tests/agent/server/llmd/llmd_client.py`)
acquires and yields the job's turn through the coordinator, and the agent's status shows both
pods holding their GPUs during it.
"""

from __future__ import annotations

import json
import secrets
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from baton.contract import names
from commands.kubectl import cli as plugin
from commands.localnode.binaries import CHECKOUT
from tests.agent.server.llmd.llmd_client import TimeSliceOrchestratorClient
from tests.k8s.cluster import AGENT_URL, Cluster, get_text, wait_for
from tests.k8s.pods import sleeper_pod

LLMD = "127.0.0.1:50051"
STATUS = "http://127.0.0.1:9465/v1/status"
PATCH = """\
# The coordinator on the single test node: one replica on the host's network (no kube-proxy
# routes its Service); the tests call it from the host, where no pod is, and `kubectl baton jobs`
# reads its status through the API server's pod proxy (which refuses loopback addresses).
apiVersion: apps/v1
kind: Deployment
metadata:
  name: baton-coordinator
  namespace: baton-system
spec:
  replicas: 1
  template:
    spec:
      hostNetwork: true
      dnsPolicy: Default
      containers:
        - name: coordinator
          imagePullPolicy: Never
          args: ["coordinator", "--allow-unidentified", "--llmd-listen", "0.0.0.0:50051",
                 "--http-listen", "0.0.0.0:9465", "--lease-duration", "6",
                 "--renew-deadline", "4", "--retry-period", "0.5"]
          env:
            - {name: KUBERNETES_SERVICE_HOST, value: 127.0.0.1}
            - {name: KUBERNETES_SERVICE_PORT, value: "16443"}
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: baton-agent
  namespace: baton-system
spec:
  template:
    spec:
      containers:
        - name: agent
          env:
            - {name: BATON_COORDINATOR, value: "127.0.0.1:50051"}
"""
COORDINATOR_OBJECTS = (
    "deployment/baton-coordinator",
    "service/baton-coordinator",
    "poddisruptionbudget/baton-coordinator",
    "serviceaccount/baton-coordinator",
    "role/baton-coordinator",
    "rolebinding/baton-coordinator",
    "lease/baton-coordinator",
    "secret/baton-coordination",
)


def overlay_with_coordinator(root: Path) -> Path:
    """A copy of manifests/ whose local overlay keeps the coordinator, patched for this node."""
    shutil.copytree(CHECKOUT / "manifests", root / "manifests")
    local = root / "manifests" / "overlays" / "local"
    kustomization = (local / "kustomization.yaml").read_text()
    assert "  - no-coordinator.yaml\n" in kustomization, "the local overlay changed its patches"
    kustomization = kustomization.replace("  - no-coordinator.yaml\n", "  - coordinator.yaml\n")
    (local / "kustomization.yaml").write_text(kustomization)
    (local / "coordinator.yaml").write_text(PATCH)
    return local


@pytest.fixture(scope="module")
def coordinated(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Baton with the coordinator; afterwards the local overlay as it was, without it."""
    overlay = overlay_with_coordinator(tmp_path_factory.mktemp("coordinator-overlay"))
    ns = names.NAMESPACE
    try:
        token = secrets.token_hex(32)
        cluster.kubectl(
            "-n", ns, "create", "secret", "generic", "baton-coordination",
            f"--from-literal=token={token}",
        )  # fmt: skip
        cluster.kubectl("apply", "-k", str(overlay), timeout=60)
        for workload in ("daemonset/baton-agent", "deployment/baton-coordinator"):
            cluster.kubectl("-n", ns, "rollout", "status", workload, "--timeout=120s", timeout=130)
        wait_for("the coordinator leading", lambda: True if leading() else None, 60)
        yield cluster
    finally:
        cluster.kubectl("-n", ns, "delete", "--ignore-not-found", *COORDINATOR_OBJECTS)
        cluster.kubectl(
            "delete", "--ignore-not-found",
            "clusterrole/baton-coordinator", "clusterrolebinding/baton-coordinator",
        )  # fmt: skip
        local = CHECKOUT / "manifests" / "overlays" / "local"
        cluster.kubectl("apply", "-k", str(local), timeout=60)
        cluster.kubectl("-n", ns, "rollout", "status", "daemonset/baton-agent", "--timeout=120s")


def leading() -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(STATUS, timeout=5) as answer:
            status: dict[str, Any] = json.loads(answer.read())
    except OSError:  # not up yet
        return None
    return status if status.get("leading") else None


def holders() -> dict[str, str]:
    """GPU → the tenant the node's agent says holds it."""
    status = json.loads(get_text(f"{AGENT_URL}/v1/status"))
    return {gpu: v["holder"] for gpu, v in status["gpus"].items() if v["holder"]}


def test_the_coordinators_deployment_drives_a_two_pod_job(
    coordinated: Cluster, namespace: str
) -> None:
    cluster = coordinated
    pods = ("rl-trainer", "rl-sampler")
    for name in pods:
        pod = sleeper_pod(
            name, namespace, duty=60
        )  # duty: one GPU each (a job's pods may not share)
        pod["metadata"]["labels"] = {names.LABEL_JOB: "rl"}
        cluster.apply(pod)
    for name in pods:
        cluster.wait_phase(namespace, name, {"Running"}, timeout=90)
    members = {f"{namespace}/{name}" for name in pods}

    def known() -> bool | None:
        tenants = set(json.loads(get_text(f"{AGENT_URL}/v1/status"))["tenants"])
        return True if members <= tenants else None

    wait_for("the agent knowing both pods", known, 30)
    selector = "app.kubernetes.io/name=baton-coordinator"
    leader = cluster.get("-n", names.NAMESPACE, "pods", "-l", selector)
    labels = leader["items"][0]["metadata"].get("labels", {})
    assert labels.get(names.LABEL_COORDINATOR_LEADER) == "true", labels
    llmd = TimeSliceOrchestratorClient(LLMD)
    try:
        assert llmd.acquire("rl", "", timeout_sec=60)[0]
        assert set(holders().values()) == members  # both pods, on their GPUs, together
        status = leading()
        assert status is not None and sorted(status["held"]) == [f"{namespace}/rl"]
        kubeconfig = str(cluster.node.plane.admin_kubeconfig)
        shown = CliRunner().invoke(plugin.app, ["jobs", "-o", "json", "--kubeconfig", kubeconfig])
        assert shown.exit_code == 0, shown.output
        (row,) = json.loads(shown.output)["jobs"]  # through the API server, from the leader
        assert (row["job"], row["state"], row["nodes"], row["gpus"]) == (
            f"{namespace}/rl",
            "holding",
            [cluster.node_name],
            2,
        )
        success, waiting, _ = llmd.release("rl", "")
        assert success and waiting == 0
        wait_for("the job's GPUs freed", lambda: True if not holders() else None, 30)
    finally:
        llmd.close()
        for name in pods:
            cluster.try_kubectl("-n", namespace, "delete", "pod", name, "--wait=false")

"""The chart's whole life on the real node, in order: `helm install` (auto: the DRA path),
`helm test`, tenants taking turns while `helm upgrade` changes the queue policy (the agent
restarts; turns and parked memory survive), `kubectl baton` against what the agents and the
scheduler say, a user without the permission refused, and `helm uninstall` leaving only what
docs/deploy.md says stays."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from baton.contract import names
from tests.k8s.cluster import AGENT_URL, get_text, metric, wait_for, wait_seen
from tests.k8s.conftest import delete_namespace
from tests.k8s.dra.claims import claim_pod, claim_template, claim_tenant
from tests.k8s.helm.conftest import CHART, HelmNode
from tests.k8s.pods import namespace_obj
from tests.tlscerts import Authority

pytestmark = pytest.mark.helm_lifecycle
"""In `make test`; `pytest -m helm_lifecycle tests/k8s/helm` runs it alone."""

NS = "t-helm"
TENANTS = ("helm-a", "helm-b", "helm-c")
HOLD = (
    "from agent.client import Baton; import threading; b = Baton(); b.acquire(timeout=60); "
    "print('holding', flush=True); threading.Event().wait()"
)
WAIT = "from agent.client import Baton; b = Baton(); print('asking', flush=True); b.acquire()"
# The agent serves its status on every address (not loopback only, as manifests/overlays/local
# does): the API server's pod proxy, which `kubectl baton` reads agents through, refuses
# loopback addresses. Turns last up to 5 min, so the why test's holder keeps its turn.
# kube-scheduler and `kubectl baton` reach the extender over HTTPS, kube-scheduler with its
# client certificate (the secrets `tls_secrets` makes). The NetworkPolicies are taken by the real
# API server (this node's bridge CNI does not enforce them).
VALUES = ["-f", str(CHART / "ci" / "local-dra-values.yaml"), "--set", "kubeletPlugin=auto",
          "--set", "hostNetwork.listenHost=", "--set", "agent.maxHoldSeconds=300",
          "--set", "extender.tls.secretName=baton-extender-tls",
          "--set", "extender.tls.clientSecretName=baton-scheduler-client",
          "--set", "scheduler.extenderURL=https://127.0.0.1:9462",
          "--set", "networkPolicy.enabled=true"]  # fmt: skip
WORKLOADS = ("daemonset/baton-agent", "daemonset/baton-dra", "deployment/baton-extender",
             "deployment/baton-scheduler")  # fmt: skip


def agent_status() -> dict[str, Any]:
    return dict(json.loads(get_text(f"{AGENT_URL}/v1/status")))


@pytest.fixture(scope="module")
def release(helm_node: HelmNode, tmp_path_factory: pytest.TempPathFactory) -> HelmNode:
    """Baton installed by `helm install --wait`, its ResourceSlice published; a test namespace."""
    tls_secrets(helm_node, tmp_path_factory.mktemp("helm-tls"))
    helm_node.helm("install", "baton", str(CHART), "--create-namespace", *VALUES,
                   "--wait", "--timeout", "240s", timeout=300)  # fmt: skip

    def published() -> bool | None:
        found = helm_node.get("resourceslices")
        return True if any(s["spec"].get("devices") for s in found["items"]) else None

    wait_for("the DRA driver's ResourceSlice", published, 90)
    helm_node.apply(namespace_obj(NS))
    account = lambda: helm_node.try_kubectl("get", "serviceaccount", "-n", NS, "default")  # noqa: E731
    wait_for("the namespace's ServiceAccount", account, 30)
    return helm_node


def tls_secrets(node: HelmNode, directory: Path) -> None:
    """The extender's serving certificate (its Service name and the loopback address the
    node's kube-scheduler dials) and kube-scheduler's client certificate, each with its CA."""
    node.apply(namespace_obj(names.NAMESPACE))
    serving = Authority(directory, "serving CA")
    service = f"baton-extender.{names.NAMESPACE}.svc"
    clients = Authority(directory, "scheduler CA")
    secrets = {
        "baton-extender-tls": (serving.issue("baton-extender", (service, "127.0.0.1")), serving),
        "baton-scheduler-client": (clients.issue("baton-scheduler", client=True), clients),
    }
    for name, ((cert, key), authority) in secrets.items():
        node.kubectl("-n", names.NAMESPACE, "create", "secret", "generic", name,
                     f"--from-file=tls.crt={cert}", f"--from-file=tls.key={key}",
                     f"--from-file=ca.crt={authority.cert}")  # fmt: skip


def test_install_takes_the_dra_path_and_every_daemon_is_ready(release: HelmNode) -> None:
    for workload in WORKLOADS:
        release.kubectl("-n", names.NAMESPACE, "rollout", "status", workload, "--timeout=60s")
    policies = release.get("networkpolicies", "-n", names.NAMESPACE)["items"]
    assert {p["metadata"]["name"] for p in policies} == {
        "baton-agent",
        "baton-dra",
        "baton-extender",
        "baton-scheduler",
    }
    log = release.kubectl("-n", names.NAMESPACE, "logs", "deployment/baton-extender")
    assert "serving on https://0.0.0.0:9462 (/bind for client certificates of" in log, log
    assert release.try_kubectl("-n", names.NAMESPACE, "get", "daemonset/baton-deviceplugin") is None
    assert release.get("deviceclass", names.DRA_DEVICE_CLASS)["spec"]["extendedResourceName"] == (
        names.RESOURCE_GPU
    )


def held_seconds() -> dict[str, float]:
    """Tenant → the GPU-seconds the agent has accounted to it. Totals outlive a release and a
    node (the state directory is the machine's), so a run's own turns are what grew."""
    held: dict[str, float] = {}
    for tenant, _, _, seconds in agent_status()["accounting"]["gpu_seconds"]:
        held[tenant] = held.get(tenant, 0.0) + seconds
    return held


@pytest.fixture(scope="module", autouse=True)
def held_at_install(release: HelmNode) -> dict[str, float]:
    """`held_seconds()` before the first test."""
    return held_seconds()


def test_helm_test_takes_and_yields_a_turn(release: HelmNode) -> None:
    tenant = f"{names.NAMESPACE}/baton-test-turn"
    before = held_seconds().get(tenant, 0.0)
    try:
        out = release.helm("test", "baton", "--timeout", "120s", timeout=150)
    except AssertionError as err:  # a timeout names no cause: the pod's events and state do
        pod = release.describe(names.NAMESPACE, "baton-test-turn")
        raise AssertionError(f"{err}\n{pod}") from None
    assert re.search(r"TEST SUITE:\s+baton-test-turn", out) and "Succeeded" in out, out
    # The pod exits 0 only after its yield; the agent accounted the turn it held.
    wait_seen("the agent to account the helm test pod's turn", held_seconds,
              lambda now: now.get(tenant, 0.0) > before, 10)  # fmt: skip


def test_upgrade_restarts_the_agent_keeping_turns_and_parked_memory(release: HelmNode) -> None:
    # The helm test pod's claim (a default share: a quarter of the duty, one of four slots) goes
    # with the pod. kube-scheduler may still count it for a moment after the API has deleted it,
    # and a pod it refused then is not retried for that deletion (seen: the third tenant waited
    # for the other two to finish, so none was ever parked). Three shares of 25 fit beside it
    # either way (25 + 3 x 25 duty, 4 slots); 3 x 30 GiB still does not fit the 80 GiB GPU.
    test_claims = lambda: release.get("resourceclaims", "-n", names.NAMESPACE)["items"]  # noqa: E731
    wait_seen("the helm test pod's claim to go", test_claims, lambda left: not left, 60)
    parked = lambda: metric(  # noqa: E731
        get_text(f"{AGENT_URL}/metrics"), "baton_moved_bytes_total", direction="park"
    )
    parked_before = parked()
    release.apply(claim_template("helm-30g", NS, 30, 25, gpu_index=0))
    release.apply(*(claim_tenant(p, NS, "helm-30g", steps=30) for p in TENANTS))
    for pod in TENANTS:
        release.wait_phase(NS, pod, {"Running"}, 90)

    # The agent has parked memory since the tenants came (its move counter, not a poll that
    # may fall between two parks), and all three are its tenants now.
    def parked_one() -> dict[str, Any] | None:
        status = agent_status()
        ours = {t for t in status["tenants"] if t.startswith(f"{NS}/")}
        return status if parked() > parked_before and len(ours) == len(TENANTS) else None

    try:
        before = wait_for("a tenant parked by the agent beside the others", parked_one, 120)
    except AssertionError as err:  # which tenants overlapped, and what the agent did
        raise AssertionError(
            f"{err}\nthe tenants:\n{release.timeline(NS)}\nthe agent's log:\n"
            + release.agent_log_tail(120)
        ) from None
    old_agent = release.daemon_pod("baton-agent")["metadata"]["name"]
    # kubectl baton status shows the same tenants and budget as the agent itself.

    def agreeing() -> dict[str, Any] | None:
        (node,) = json.loads(release.plugin("status", "-o", "json").stdout)["nodes"]
        status = agent_status()
        same = all(
            sorted(g["tenants"]) == sorted(status["gpus"].get(g["uuid"], {}).get("tenants", []))
            for g in node["gpus"]
        )
        return node if same else None

    node = wait_for("kubectl baton status to agree with the agent", agreeing, 30)
    assert node["host_memory_budget_bytes"] == before["residency"]["host_memory_budget_bytes"]
    assert {t for g in node["gpus"] for t in g["tenants"]} >= {f"{NS}/{p}" for p in TENANTS}
    release.helm("upgrade", "baton", str(CHART), *VALUES, "--set", "agent.queuePolicy=lrs",
                 "--wait", "--timeout", "180s", timeout=240)  # fmt: skip
    new_agent = release.daemon_pod("baton-agent")["metadata"]["name"]
    assert new_agent != old_agent, "the agent was not restarted"
    after = wait_seen("the new agent", agent_status, lambda s: s["policy"] == "lrs", 60)
    # Every tenant of the old agent is the new one's, but one that finished meanwhile (its
    # pod Succeeded: gone from the node, so from the agent, as it should be).
    missing = {t for t in before["tenants"] if t.startswith(f"{NS}/")} - set(after["tenants"])
    phases = {t: release.pod(NS, t.split("/", 1)[1])["status"].get("phase") for t in missing}
    assert all(phase == "Succeeded" for phase in phases.values()), phases
    release.wait_succeeded(NS, *TENANTS, timeout=300)
    for pod in TENANTS:
        logs = release.logs(NS, pod)
        assert "memory verified" in logs and "done:" in logs, logs


def test_usage_matches_the_agents_accounting(
    release: HelmNode, held_at_install: dict[str, float]
) -> None:
    shown = json.loads(release.plugin("usage", "-n", NS, "-o", "json").stdout)
    accounting = agent_status()["accounting"]
    expected = {t: v for t, ns, _, v in accounting["gpu_seconds"] if ns == NS}
    got = {row["tenant"]: row["gpu_seconds"] for row in shown["rows"]}
    assert set(got) == set(expected), (got, expected)
    for tenant, seconds in expected.items():
        assert got[tenant] == pytest.approx(seconds, abs=1e-3)
    # Every tenant of this run held turns (an earlier run's totals are in `expected` too).
    for tenant in (f"{NS}/{p}" for p in TENANTS):
        assert expected[tenant] > held_at_install.get(tenant, 0.0), tenant


def test_why_says_what_the_agent_and_the_scheduler_say(release: HelmNode) -> None:
    release.kubectl("delete", "pod", "-n", NS, *TENANTS, "--wait=true", timeout=90)
    claims = lambda: None if release.get("resourceclaims", "-n", NS)["items"] else True  # noqa: E731
    wait_for("the finished tenants' claims to go", claims, 60)
    release.apply(claim_template("helm-d60", NS, 10, 60, gpu_index=0))
    release.apply(claim_template("helm-d30", NS, 10, 30, gpu_index=0))
    release.apply(claim_pod("holder", NS, "helm-d60", f'exec python3 -c "{HOLD}"'))
    release.wait_phase(NS, "holder", {"Running"}, 90)
    wait_for("the holder's turn", lambda: "holding" in release.logs(NS, "holder") or None, 60)
    release.apply(claim_pod("waiter", NS, "helm-d30", f'exec python3 -c "{WAIT}"'))
    release.wait_phase(NS, "waiter", {"Running"}, 90)

    def queued() -> dict[str, Any] | None:
        for gpu in agent_status()["gpus"].values():
            for entry in gpu["queue"]:
                if entry["tenant_id"] == f"{NS}/waiter":
                    return dict(entry)
        return None

    entry = wait_for("the waiter in the agent's queue", queued, 60)
    waiting = json.loads(release.plugin("why", f"{NS}/waiter", "-o", "json").stdout)
    assert waiting["stage"] == "turn"
    assert entry["why"] in waiting["reasons"][0] and f"{NS}/holder" in waiting["reasons"][0]
    # A third share of GPU 0's duty does not fit (60 + 30 + 30 > 100): DRA alone refuses.
    release.apply(claim_pod("refused", NS, "helm-d30", "exec sleep 3600"))
    event = wait_for("the scheduler's refusal", lambda: _refusal(release, "refused"), 60)
    pending = json.loads(release.plugin("why", f"{NS}/refused", "-o", "json").stdout)
    assert pending["stage"] == "scheduling" and event in pending["reasons"][0]
    assert any("gpu-0" in r and "lacks duty (10% free of 100%, 30% asked)" in r
               for r in pending["reasons"]), pending  # fmt: skip


def _refusal(release: HelmNode, pod: str) -> str | None:
    events = release.get("events", "-n", NS, "--field-selector", f"involvedObject.name={pod}")
    for event in events["items"]:
        if (
            event["reason"] == "FailedScheduling"
            and "cannot allocate all claims" in event["message"]
        ):
            return str(event["message"])
    return None


def test_a_user_without_the_permission_is_refused_naming_it(release: HelmNode, tmp_path) -> None:
    release.kubectl("-n", NS, "create", "serviceaccount", "viewer")
    release.kubectl("-n", names.NAMESPACE, "create", "role", "list-pods", "--verb=list",
                    "--resource=pods")  # fmt: skip
    release.kubectl("-n", names.NAMESPACE, "create", "rolebinding", "viewer-list-pods",
                    "--role=list-pods", f"--serviceaccount={NS}:viewer")  # fmt: skip
    token = release.kubectl("-n", NS, "create", "token", "viewer").strip()
    config = yaml.safe_load(Path(release.kubeconfig).read_text())
    config["users"] = [{"name": "viewer", "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = "viewer"
    path = tmp_path / "viewer.kubeconfig"
    path.write_text(json.dumps(config))
    refused = release.plugin("status", kubeconfig=str(path), check=False)
    assert refused.returncode == 1
    (line,) = refused.stderr.strip().splitlines()
    # It may list the agent pods, not read the extender's inventory through the service proxy.
    assert line.startswith("kubectl baton: forbidden:") and '"services/proxy"' in line, line
    assert f"system:serviceaccount:{NS}:viewer" in line, line


def test_uninstall_leaves_only_what_the_docs_name(release: HelmNode) -> None:
    delete_namespace(release, NS)
    release.kubectl("-n", names.NAMESPACE, "delete", "rolebinding", "viewer-list-pods")
    release.kubectl("-n", names.NAMESPACE, "delete", "role", "list-pods")
    release.helm("uninstall", "baton", "--wait", "--timeout", "120s", timeout=150)
    kinds = "all,configmaps,serviceaccounts,roles,rolebindings,leases,endpointslices"

    def left(namespace: str) -> set[str]:
        found = json.loads(release.kubectl("get", kinds, "-n", namespace, "-o", "json"))
        return {f"{o['kind']}/{o['metadata']['name']}" for o in found["items"]}

    # What the control plane puts into every namespace, as `default` holds it: kube-root-ca.crt,
    # the default ServiceAccount, and what a distribution's controllers publish (this node's
    # OpenShift-carried kube-controller-manager adds openshift-service-ca.crt); and the Lease.
    stays = left("default") | {"Lease/baton-scheduler"}
    wait_seen("only what docs/deploy.md names to stay", lambda: left(names.NAMESPACE),
              lambda now: now <= stays, 60)  # fmt: skip
    cluster_wide = json.loads(release.kubectl("get", "clusterroles,clusterrolebindings,"
                                              "deviceclasses", "-o", "json"))  # fmt: skip
    baton = [
        o["metadata"]["name"] for o in cluster_wide["items"] if "baton" in o["metadata"]["name"]
    ]
    assert baton == [], baton
    gone = lambda: True if not release.get("resourceslices")["items"] else None  # noqa: E731
    wait_for("the kubelet to delete the driver's ResourceSlice", gone, 90)
    kube_system = release.get("rolebindings", "-n", "kube-system")["items"]
    assert not [o for o in kube_system if o["metadata"]["name"].startswith("baton-")]

"""Faults on the DRA path with nothing lost: running claim tenants keep their GPU and verify
their memory, the driver's record outlives it, and new claims are prepared after each fault."""

from __future__ import annotations

import json
import re
from pathlib import Path

from baton.contract import names
from tests.k8s.cluster import Cluster, wait_for
from tests.k8s.dra.claims import claim_template, claim_tenant
from tests.k8s.dra.conftest import CDI_DIR
from tests.k8s.dra.test_claims import pod_claim
from tests.k8s.dra.test_health import fake
from tests.k8s.test_faults import replaced
from tests.k8s.test_rbac import still_denied

RECORD = Path(names.DRA_STATE_DIR) / "prepared-claims.json"
LONG_STEPS = 30


def registrations(cluster: Cluster) -> int | None:
    """How often the driver registered with the kubelet; None while its log cannot be read
    (`kubectl logs` goes through the kubelet, which may be restarting)."""
    pod = cluster.daemon_pod("baton-dra")["metadata"]["name"]
    text = cluster.try_kubectl("logs", "-n", names.NAMESPACE, pod)
    return None if text is None else text.count("registered with the kubelet")


def published(cluster: Cluster) -> bool | None:
    """Whether the driver's slice of the node exists (the kubelet deletes it when it starts)."""
    found = cluster.get("resourceslices", f"--field-selector=spec.nodeName={cluster.node_name}")
    return True if any(s["spec"]["driver"] == names.DRA_DRIVER for s in found["items"]) else None


def recorded() -> str:
    """The driver's record of prepared claims as it is on the node ("" before the first)."""
    return RECORD.read_text() if RECORD.exists() else ""


def start(cluster: Cluster, ns: str, *pods: str, steps: int = LONG_STEPS) -> None:
    """Claim tenants, waited for until each has taken a turn."""
    cluster.apply(claim_template("fault-20g", ns, 20, 20))
    cluster.apply(*(claim_tenant(p, ns, "fault-20g", steps=steps) for p in pods))
    for pod in pods:
        cluster.wait_phase(ns, pod, {"Running"}, 120)
        wait_for(
            f"{pod}'s first turn",
            lambda pod=pod: True if "held" in cluster.logs(ns, pod) else None,  # type: ignore[misc]
            60,
        )


def verified(cluster: Cluster, ns: str, *pods: str) -> None:
    cluster.wait_succeeded(ns, *pods, timeout=240)
    for pod in pods:
        logs = cluster.logs(ns, pod)
        assert "memory verified" in logs and "done:" in logs, logs


def spec_of(cluster: Cluster, ns: str, pod: str) -> Path:
    return CDI_DIR / f"baton-claim-{pod_claim(cluster, ns, pod)['metadata']['uid']}.json"


def test_kubelet_restart_republishes_the_slice_and_tenants_keep_their_gpu(
    dra_cluster: Cluster, dra_namespace: str
) -> None:
    ns = dra_namespace
    start(dra_cluster, ns, "kr-a", "kr-b")
    registered = registrations(dra_cluster)
    assert registered
    dra_cluster.node.stop_kubelet()
    dra_cluster.node.start_kubelet()
    wait_for(
        "the driver to register again",
        lambda: True if (registrations(dra_cluster) or 0) > registered else None,
        90,
    )
    wait_for("the slice published again", lambda: published(dra_cluster), 60)
    verified(dra_cluster, ns, "kr-a", "kr-b")
    start(dra_cluster, ns, "kr-after", steps=2)
    verified(dra_cluster, ns, "kr-after")


def test_driver_restarted_keeps_its_record_and_prepares_what_came_meanwhile(
    dra_cluster: Cluster, dra_namespace: str
) -> None:
    ns = dra_namespace
    start(dra_cluster, ns, "dr-a")
    before = spec_of(dra_cluster, ns, "dr-a")
    wait = replaced(dra_cluster, "baton-dra")
    dra_cluster.apply(claim_tenant("dr-meanwhile", ns, "fault-20g", steps=2))
    wait()
    recorded = json.loads(RECORD.read_text())
    assert pod_claim(dra_cluster, ns, "dr-a")["metadata"]["uid"] in json.dumps(recorded)
    verified(dra_cluster, ns, "dr-meanwhile", "dr-a")
    dra_cluster.kubectl("delete", "pod", "-n", ns, "dr-a", "dr-meanwhile", timeout=90)
    wait_for(
        "the spec prepared before the restart removed by the new driver",
        lambda: True if not before.exists() else None,
        90,
    )


def test_driver_killed_mid_prepare_prepares_the_claim_again_from_nothing(
    dra_cluster: Cluster, dra_namespace: str
) -> None:
    """The driver holds a prepare between writing the claim's spec and recording it (the fake
    fault `/fake/hold-prepare`) and is deleted there; the new driver removes the spec as an
    orphan, the real kubelet prepares again, and the tenant runs with its env and verifies."""
    ns = dra_namespace
    driver = dra_cluster.daemon_pod("baton-dra")["metadata"]["name"]
    assert fake("/fake/hold-prepare", {}) == {"armed": True}
    dra_cluster.apply(claim_template("fault-20g", ns, 20, 20))
    dra_cluster.apply(claim_tenant("mid-a", ns, "fault-20g", steps=2))
    wait_for(
        "the driver to hold the prepare",
        lambda: "holding the prepare of claim" in dra_cluster.logs(names.NAMESPACE, driver) or None,
        90,
    )
    uid = pod_claim(dra_cluster, ns, "mid-a")["metadata"]["uid"]
    spec = spec_of(dra_cluster, ns, "mid-a")
    assert spec.exists() and uid not in recorded(), "cut between the spec and the record"
    wait = replaced(dra_cluster, "baton-dra")
    wait()
    verified(dra_cluster, ns, "mid-a")
    # The claim is unprepared once its pod has finished: what the new driver did is in its log.
    new = dra_cluster.logs(names.NAMESPACE, dra_cluster.daemon_pod("baton-dra")["metadata"]["name"])
    assert f"removed CDI spec {spec}" in new, new
    assert re.search(rf"(?<!un)prepared claim {ns}/\S+ \({uid}\)", new), new


def test_apiserver_restart(dra_cluster: Cluster, dra_namespace: str) -> None:
    ns = dra_namespace
    start(dra_cluster, ns, "api-a")
    dra_cluster.node.plane.stop_apiserver()
    dra_cluster.node.plane.start_apiserver()
    start(dra_cluster, ns, "api-after", steps=2)
    verified(dra_cluster, ns, "api-after", "api-a")


def test_the_driver_and_agent_run_on_their_own_accounts_with_nothing_denied(
    dra_cluster: Cluster,
) -> None:
    driver = dra_cluster.daemon_pod("baton-dra")
    assert driver["spec"]["serviceAccountName"] == "baton-dra"
    agent = dra_cluster.daemon_pod("baton-agent")
    for pod in (driver, agent):
        logs = dra_cluster.logs(names.NAMESPACE, pod["metadata"]["name"])
        # A kube-apiserver just restarted (test_apiserver_restart) refuses until its RBAC caches
        # fill: a refusal retried, or one the authorizer allows now, was that (tests/k8s/test_rbac).
        denied = [line for line in logs.splitlines() if "forbidden" in line.lower()]
        retried = [line for line in denied if "retrying with backoff" not in line]
        assert not [line for line in retried if still_denied(dra_cluster, line)], logs
    can = dra_cluster.kubectl(
        "auth", "can-i", "update", "resourceslices.resource.k8s.io",
        f"--as=system:serviceaccount:{names.NAMESPACE}:baton-dra",
    )  # fmt: skip
    assert can.strip() == "yes"
    cannot = dra_cluster.node.kubectl(
        "auth", "can-i", "delete", "pods",
        f"--as=system:serviceaccount:{names.NAMESPACE}:baton-dra", check=False,
    )  # fmt: skip
    assert cannot.strip() == "no"

"""Device health through the real kubelet: a critical XID on a claim's GPU shows in its pod's
`allocatedResourcesStatus` (the kubelet's reading of the driver's health stream) and as the
device's taint in the ResourceSlice, for that GPU only; both clear when it recovers."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

from baton.contract import names
from baton.contract.draclaim import claim_shares
from dra.cdi import cdi_id
from dra.service import HEALTH_TIMEOUT_S
from dra.slices import TAINT_UNHEALTHY
from tests.k8s.cluster import Cluster, wait_for, wait_seen
from tests.k8s.dra.claims import claim_pod, claim_template
from tests.k8s.dra.test_claims import node_slice, pod_claim

DRA_URL = f"http://127.0.0.1:{names.PORT_DRA}"
"""The driver's metrics port: host networking, loopback (manifests/overlays/local-dra)."""
KUBELET_HEALTH = Path("/var/lib/kubelet/dra_health_state")
"""The kubelet's checkpoint of the health each driver last reported, shown when a wait fails."""
SICK, WELL = 1, 0
WAIT_S = 60.0
KUBELET_SYNC_S = 10
"""How often the local kubelet syncs a pod's status (syncFrequency, commands.localnode.kubelet)."""

Shown = dict[str, list[tuple[str, str, str]]]


def fake(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST a fake health event to the driver; its JSON answer."""
    request = urllib.request.Request(
        DRA_URL + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=5) as reply:
        return dict(json.loads(reply.read()))


def pod_health(cluster: Cluster, namespace: str, pod: str) -> Shown:
    """What the kubelet shows: `claim:<name>` → [(resourceID, health, message)]."""
    found: Shown = {}
    statuses = cluster.pod(namespace, pod).get("status", {}).get("containerStatuses") or []
    for status in statuses:
        for resource in status.get("allocatedResourcesStatus") or []:
            found.setdefault(resource["name"], []).extend(
                (r["resourceID"], r.get("health", ""), r.get("message", ""))
                for r in resource.get("resources") or []
            )
    return found


def kubelet_cache() -> str:
    """The kubelet's health checkpoint, for a failure's message."""
    return KUBELET_HEALTH.read_text() if KUBELET_HEALTH.exists() else "(none)"


def slice_taints(cluster: Cluster) -> dict[str, list[tuple[str, str]]]:
    """Device name → its taints (key, effect) in the driver's slice of the node."""
    devices = node_slice(cluster)["spec"]["devices"]
    return {d["name"]: [(t["key"], t["effect"]) for t in d.get("taints") or []] for d in devices}


def claim_on(cluster: Cluster, ns: str, pod: str, gpu: int) -> str:
    """A running pod with a 10 GiB claim pinned to GPU `gpu`; the CDI ID the driver returned
    first for the claim's device (its own), which the kubelet shows as its resourceID."""
    cluster.apply(claim_template(f"{pod}-10g", ns, 10, 10, gpu_index=gpu))
    cluster.apply(claim_pod(pod, ns, f"{pod}-10g"))
    cluster.wait_phase(ns, pod, {"Running"}, 120)
    claim = pod_claim(cluster, ns, pod)
    (share,) = claim_shares(claim)
    assert share.device == names.dra_device_name(gpu), share
    return cdi_id(claim["metadata"]["uid"], share.device)


def test_an_xid_on_a_claims_gpu_shows_in_its_pod_status_and_taints_only_that_device(
    dra_cluster: Cluster, dra_namespace: str
) -> None:
    ns = dra_namespace
    ids = {
        pod: claim_on(dra_cluster, ns, pod, gpu) for pod, gpu in (("sick", SICK), ("well", WELL))
    }

    def shows(pod: str, health: str, message: str = "") -> None:
        """Wait until the kubelet shows the pod's one claim device with this health."""
        wanted = {"claim:gpu": [(ids[pod], health, message)]}
        wait_seen(
            f"pod {pod}'s allocatedResourcesStatus to show {ids[pod]} {health}",
            lambda: (pod_health(dra_cluster, ns, pod), kubelet_cache()),
            lambda seen: seen[0] == wanted,
            WAIT_S,
        )

    for pod in ids:
        shows(pod, "Healthy")
    sick, well = names.dra_device_name(SICK), names.dra_device_name(WELL)
    try:
        answer = fake("/fake/xid", {"gpu": str(SICK), "xid": 79})
        assert answer["changed"] is True, answer
        shows("sick", "Unhealthy", "XID 79")
        shows("well", "Healthy")
        wait_seen(
            f"the slice to taint {sick}, and only it, {TAINT_UNHEALTHY}",
            lambda: slice_taints(dra_cluster),
            lambda seen: seen == {sick: [(TAINT_UNHEALTHY, "NoSchedule")], well: []},
            WAIT_S,
        )
        assert dra_cluster.pod(ns, "sick")["status"]["phase"] == "Running", "a taint evicted it"
    finally:
        fake("/fake/recover", {"gpu": str(SICK)})
    shows("sick", "Healthy")
    wait_seen(
        "the slice's taints gone",
        lambda: slice_taints(dra_cluster),
        lambda seen: not any(seen.values()),
        WAIT_S,
    )


def test_a_healthy_device_stays_healthy_past_the_kubelets_timeout(
    dra_cluster: Cluster, dra_namespace: str
) -> None:
    """The kubelet shows a device Unknown once its last report is older than the timeout sent
    with it: nothing changing, the driver's repeated reports keep the pod's status Healthy."""
    ns = dra_namespace
    wanted = {"claim:gpu": [(claim_on(dra_cluster, ns, "steady", WELL), "Healthy", "")]}
    wait_seen(
        "pod steady's allocatedResourcesStatus to show its device Healthy",
        lambda: pod_health(dra_cluster, ns, "steady"),
        lambda seen: seen == wanted,
        WAIT_S,
    )
    hold_s = HEALTH_TIMEOUT_S + 2 * KUBELET_SYNC_S
    began = time.monotonic()

    def still_healthy() -> bool | None:
        seen = pod_health(dra_cluster, ns, "steady")
        held = time.monotonic() - began
        assert seen == wanted, f"after {held:.0f} s the kubelet shows {seen}\n{kubelet_cache()}"
        return True if held >= hold_s else None

    wait_for(f"pod steady to show Healthy for {hold_s} s", still_healthy, hold_s + 30, every=1.0)

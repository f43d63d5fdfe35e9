"""The driver with the real kube-scheduler, kubelet and containerd 2.x: claims are allocated by
memory and duty, prepared through the driver, and reach containers through CDI."""

from __future__ import annotations

import json
from typing import Any

from baton.contract import names
from baton.contract.draclaim import claim_shares
from tests.k8s.cluster import AGENT_URL, Cluster, get_text, wait_for
from tests.k8s.dra.claims import GIB, claim_pod, claim_template, limit_pod
from tests.k8s.dra.conftest import CDI_DIR
from tests.k8s.pods import REPORT, report

GPU_MIB = 81920
SLOTS = 4


def node_slice(cluster: Cluster) -> dict[str, Any]:
    """The driver's one ResourceSlice of the node."""
    found = cluster.get("resourceslices", f"--field-selector=spec.nodeName={cluster.node_name}")
    (ours,) = [s for s in found["items"] if s["spec"]["driver"] == names.DRA_DRIVER]
    return dict(ours)


def uuids(cluster: Cluster) -> dict[str, str]:
    """Device name → GPU UUID, from the slice."""
    devices = node_slice(cluster)["spec"]["devices"]
    return {d["name"]: d["attributes"][names.DRA_ATTRIBUTE_UUID]["string"] for d in devices}


def pod_claim(cluster: Cluster, namespace: str, pod: str) -> dict[str, Any]:
    """The claim the pod's status names (from a template or generated for a limit)."""
    status = cluster.pod(namespace, pod)["status"]
    statuses = status.get("resourceClaimStatuses") or []
    name = statuses[0]["resourceClaimName"] if statuses else None
    if name is None:  # the claim generated for `baton.dev/gpu: 1`
        name = status["extendedResourceClaimStatus"]["resourceClaimName"]
    return cluster.get("resourceclaim", "-n", namespace, name)


def reported(cluster: Cluster, namespace: str, pod: str) -> dict[str, str]:
    """What the container printed of its env, once it has."""
    return wait_for(
        f"{pod}'s report",
        lambda: report(cluster.logs(namespace, pod)) or None,
        30,
    )


def test_slice_publishes_each_gpu_as_a_shareable_device(dra_cluster: Cluster) -> None:
    spec = node_slice(dra_cluster)["spec"]
    assert spec["pool"]["name"] == dra_cluster.node_name
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1"]
    for device in spec["devices"]:
        assert device["allowMultipleAllocations"] is True
        capacity = device["capacity"]
        assert int(capacity["memory"]["value"]) == GPU_MIB * names.MIB * SLOTS
        assert capacity["duty"]["value"] == "100"
        assert capacity["slots"]["value"] == str(SLOTS)


def test_three_share_a_gpu_the_fourth_waits_and_too_large_is_refused(
    dra_cluster: Cluster, dra_namespace: str
) -> None:
    ns = dra_namespace
    dra_cluster.apply(
        claim_template("share-30g", ns, 30, 30, gpu_index=0),
        claim_template("too-large", ns, 90, 10),
    )
    tenants = ["tenant-a", "tenant-b", "tenant-c"]
    dra_cluster.apply(*(claim_pod(p, ns, "share-30g") for p in tenants))
    for pod in tenants:
        dra_cluster.wait_phase(ns, pod, {"Running"}, 120)
    dra_cluster.apply(claim_pod("tenant-d", ns, "share-30g"), claim_pod("huge", ns, "too-large"))
    gpu0 = uuids(dra_cluster)["gpu-0"]
    specs = {}
    for pod in tenants:
        claim = pod_claim(dra_cluster, ns, pod)
        (share,) = claim_shares(claim)
        assert (share.device, share.memory_bytes, share.duty) == ("gpu-0", 30 * GIB, 30), share
        env = reported(dra_cluster, ns, pod)
        assert env["BATON_GPUS"] == gpu0, env
        assert env["BATON_AGENT_SOCKET"].startswith("/run/baton/"), env
        assert "mount: " in dra_cluster.logs(ns, pod), "the agent socket's directory is mounted"
        specs[pod] = CDI_DIR / f"baton-claim-{claim['metadata']['uid']}.json"
        assert json.loads(specs[pod].read_text())["kind"] == names.CDI_KIND_CLAIM

    def unschedulable(pod: str) -> str | None:
        text = dra_cluster.describe(ns, pod)
        return text if "FailedScheduling" in text else None

    waits = wait_for("tenant-d's FailedScheduling event", lambda: unschedulable("tenant-d"), 60)
    refused = wait_for("huge's FailedScheduling event", lambda: unschedulable("huge"), 60)
    print(f"\n--- tenant-d (duty full) ---\n{waits}\n--- huge (90Gi) ---\n{refused}")
    assert dra_cluster.pod(ns, "tenant-d")["status"]["phase"] == "Pending"
    assert dra_cluster.pod(ns, "huge")["status"]["phase"] == "Pending"
    assert "cannot allocate all claims" in waits and "cannot allocate all claims" in refused

    dra_cluster.kubectl("delete", "pod", "-n", ns, "tenant-a", "--wait=true", timeout=90)
    wait_for(
        "tenant-a's CDI spec removed (unprepared)",
        lambda: True if not specs["tenant-a"].exists() else None,
        60,
    )
    dra_cluster.wait_phase(ns, "tenant-d", {"Running"}, 120)
    assert reported(dra_cluster, ns, "tenant-d")["BATON_GPUS"] == gpu0


def test_a_plain_gpu_limit_gets_a_generated_claim(dra_cluster: Cluster, dra_namespace: str) -> None:
    ns = dra_namespace
    dra_cluster.apply(limit_pod("plain", ns))
    dra_cluster.wait_phase(ns, "plain", {"Running"}, 120)
    claim = pod_claim(dra_cluster, ns, "plain")
    (share,) = claim_shares(claim)
    assert share.memory_bytes == GPU_MIB * names.MIB and share.duty == 100 // SLOTS, share
    assert reported(dra_cluster, ns, "plain")["BATON_GPUS"] == uuids(dra_cluster)[share.device]


def test_a_container_naming_two_claims_sees_both_gpus(
    dra_cluster: Cluster, dra_namespace: str
) -> None:
    """CDI sets a variable once per container: the runtime keeps one claim's `BATON_GPUS`; each
    device's `BATON_CLAIM_GPU_<index>` names its GPU, and the client reads them all."""
    ns = dra_namespace
    dra_cluster.apply(
        claim_template("first-gpu", ns, 1, 5, gpu_index=0),
        claim_template("second-gpu", ns, 1, 5, gpu_index=1),
    )
    client = "from agent.client.types import gpus_from as g; print('CLIENT_GPUS=' + ','.join(g()))"
    pod = claim_pod("both", ns, "first-gpu", REPORT + f'python -c "{client}"; exec sleep 3600')
    pod["spec"]["resourceClaims"] = [
        {"name": "a", "resourceClaimTemplateName": "first-gpu"},
        {"name": "b", "resourceClaimTemplateName": "second-gpu"},
    ]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "a"}, {"name": "b"}]
    dra_cluster.apply(pod)
    dra_cluster.wait_phase(ns, "both", {"Running"}, 120)
    env = wait_for(
        "both's client report",
        lambda: r if "CLIENT_GPUS" in (r := report(dra_cluster.logs(ns, "both"))) else None,
        30,
    )
    print(f"\n--- both ---\n{env}")
    gpus = uuids(dra_cluster)
    assert env["BATON_CLAIM_GPU_0"] == gpus["gpu-0"] and env["BATON_CLAIM_GPU_1"] == gpus["gpu-1"]
    assert env["BATON_GPUS"] in gpus.values(), env  # one claim's: the runtime keeps one
    assert sorted(env["CLIENT_GPUS"].split(",")) == sorted(gpus.values()), env

    def seen() -> Any:
        return json.loads(get_text(f"{AGENT_URL}/v1/status"))["tenants"].get(f"{ns}/both")

    tenant = wait_for("the agent to know the pod", seen, 60)
    assert sorted(tenant["gpus"]) == sorted(gpus.values()), tenant  # its turns cover both

"""Claim tenants on the real node take turns through the agent as on the device-plugin path:
the GPU in each container's env, the claim's allocation and the agent's view agree, and three
30000 MiB tenants on one 80 GiB GPU are parked and restored with their memory verified."""

from __future__ import annotations

import json
from typing import Any

from baton.contract import names
from baton.contract.draclaim import claim_shares
from tests.k8s.cluster import AGENT_URL, Cluster, get_text, metric, wait_for
from tests.k8s.dra.claims import GIB, claim_template, claim_tenant
from tests.k8s.dra.test_claims import pod_claim, reported, uuids

TENANTS = ("turn-a", "turn-b", "turn-c")


def agent_tenants() -> dict[str, Any]:
    """The agent's tenants by id, from /v1/status."""
    return dict(json.loads(get_text(f"{AGENT_URL}/v1/status"))["tenants"])


def test_claim_tenants_take_turns_and_the_agent_sees_their_claims(
    dra_cluster: Cluster, dra_namespace: str
) -> None:
    ns = dra_namespace
    moved_before = metric(get_text(f"{AGENT_URL}/metrics"), "baton_moved_bytes_total")
    dra_cluster.apply(claim_template("turns-30g", ns, 30, 30, gpu_index=0))
    dra_cluster.apply(*(claim_tenant(p, ns, "turns-30g", steps=20) for p in TENANTS))
    gpu0 = uuids(dra_cluster)["gpu-0"]
    for pod in TENANTS:
        dra_cluster.wait_phase(ns, pod, {"Running", "Succeeded"}, 120)
        (share,) = claim_shares(pod_claim(dra_cluster, ns, pod))
        assert share.device == "gpu-0" and share.memory_bytes == 30 * GIB
        assert reported(dra_cluster, ns, pod)[names.ENV_GPUS] == gpu0

    def seen() -> dict[str, Any] | None:
        tenants = agent_tenants()
        return tenants if all(f"{ns}/{p}" in tenants for p in TENANTS) else None

    tenants = wait_for("the agent to know every claim tenant", seen, 60)
    for pod in TENANTS:
        tenant = tenants[f"{ns}/{pod}"]
        assert tenant["gpus"] == [gpu0], tenant
        assert tenant["container_gpus"] == {"trainer": [gpu0]}, tenant
        assert (tenant["gpu_memory_mib"], tenant["gpu_duty"]) == (30 * 1024, 30), tenant
    dra_cluster.wait_succeeded(ns, *TENANTS, timeout=240)
    agent = dra_cluster.daemon_pod("baton-agent")["metadata"]["name"]
    agent_log = dra_cluster.logs(names.NAMESPACE, agent)
    for pod in TENANTS:
        logs = dra_cluster.logs(ns, pod)
        assert "memory verified" in logs and "done:" in logs, logs
        assert f"tenant {ns}/{pod}: its last session ended" in agent_log
    moved = metric(get_text(f"{AGENT_URL}/metrics"), "baton_moved_bytes_total") - moved_before
    assert moved > 0, "no tenant was parked and restored"

"""The extender on the DRA path with the real kube-scheduler: a claim whose GPU (the first that
fits, as the scheduler allocates) would park more than the node's host budget is refused with
the extender's reason, which DRA's device capacities cannot express."""

from __future__ import annotations

from tests.k8s.cluster import Cluster, wait_for
from tests.k8s.dra.claims import claim_pod, claim_template
from tests.k8s.dra.test_claims import pod_claim

BUDGET_GIB = 128
"""The local-dra overlay's host budget (BATON_HOST_MEMORY_BUDGET 131072 MiB)."""


def test_a_claim_past_the_host_budget_is_refused_with_the_extenders_reason(
    dra_cluster: Cluster, dra_namespace: str
) -> None:
    ns = dra_namespace
    # 75 GiB and duty 30: three fit gpu-0's capacities (duty 90, memory within 4 x 80 GiB),
    # but two parked beside the third need 150 GiB of host DRAM.
    dra_cluster.apply(claim_template("big-75g", ns, 75, 30))
    dra_cluster.apply(claim_pod("tenant-a", ns, "big-75g"), claim_pod("tenant-b", ns, "big-75g"))
    for pod in ("tenant-a", "tenant-b"):
        dra_cluster.wait_phase(ns, pod, {"Running"}, 120)
        devices = [r["device"] for r in pod_claim(dra_cluster, ns, pod)["status"]["allocation"]
                   ["devices"]["results"]]  # fmt: skip
        assert devices == ["gpu-0"], devices
    dra_cluster.apply(claim_pod("tenant-c", ns, "big-75g"))

    def refused() -> str | None:
        text = dra_cluster.describe(ns, "tenant-c")
        return text if "FailedScheduling" in text and "host budget" in text else None

    text = wait_for("tenant-c's FailedScheduling event from the extender", refused, 90)
    print(f"\n--- tenant-c ---\n{text}")
    assert "the scheduler would allocate gpu-0" in text
    assert f"parked worst case would be 150 GiB > host budget {BUDGET_GIB} GiB" in text
    assert dra_cluster.pod(ns, "tenant-c")["status"]["phase"] == "Pending"
    dra_cluster.kubectl("delete", "pod", "-n", ns, "tenant-a", "--wait=true", timeout=90)
    dra_cluster.wait_phase(ns, "tenant-c", {"Running"}, 120)

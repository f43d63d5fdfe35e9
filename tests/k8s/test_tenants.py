"""Tenants on the real node: kube-scheduler → extender → kubelet → device plugin → agent."""

from __future__ import annotations

import re

from baton.contract import names
from tests.k8s.cluster import AGENT_URL, Cluster, get_text, metric
from tests.k8s.pods import report, tenant_pod

TENANTS = ("grpo-a", "grpo-b", "grpo-c")


def test_tenants_take_turns_with_what_allocate_gave_them(cluster: Cluster, namespace: str) -> None:
    parked_before = metric(get_text(f"{AGENT_URL}/metrics"), "baton_moved_bytes_total")
    cluster.apply(*(tenant_pod(name, namespace) for name in TENANTS))
    cluster.wait_succeeded(namespace, *TENANTS, timeout=120)
    allocations = cluster.kubelet_allocations()
    agent_log = cluster.logs(names.NAMESPACE, cluster.daemon_pod("baton-agent")["metadata"]["name"])
    gpus_used = set()
    for name in TENANTS:
        pod = cluster.pod(namespace, name)
        notes = pod["metadata"]["annotations"]
        uid = pod["metadata"]["uid"]
        logs = cluster.logs(namespace, name)
        env = report(logs)
        assigned = notes[names.ANNOTATION_ASSIGNED_GPUS]
        gpus_used.add(assigned)
        assert names.ANNOTATION_ALLOCATED_AT in notes
        # Exactly what Allocate returned: the assigned GPU, the agent's socket, read-only.
        assert env[names.ENV_GPUS] == assigned
        assert env[names.ENV_NVIDIA_VISIBLE_DEVICES] == assigned
        assert env[names.ENV_AGENT_SOCKET] == names.AGENT_SOCKET
        assert re.search(r"^mount: .* /run/baton ro[, ]", logs, re.M), logs
        # The kubelet's own record names slots of that GPU.
        devices = allocations[(uid, "trainer")]
        assert [d.split("::")[0] for d in devices] == [assigned]
        # A real pod cgroup, and the agent named the tenant after its pod from it.
        assert f"pod{uid}" in logs
        assert f"tenant {namespace}/{name}: its last session ended" in agent_log
        assert "memory verified" in logs, logs
        # As the image's user, not root: the fake GPU memory files are open to every UID.
        assert env["TENANT_UID"] == "65532", logs
        sched = cluster.describe(namespace, name)
        assert re.search(rf"Scheduled .*{names.SCHEDULER_NAME}\s+Successfully assigned", sched)
    # binpack puts all three on one 80 GiB GPU, where two 30000 MiB tenants fit and three don't.
    assert len(gpus_used) == 1
    moved = metric(get_text(f"{AGENT_URL}/metrics"), "baton_moved_bytes_total") - parked_before
    assert moved > 0, "no tenant was parked and restored"


def test_example_job_runs_to_completion(cluster: Cluster) -> None:
    from commands.localnode import images
    from commands.localnode.binaries import CHECKOUT

    overlay = CHECKOUT / "manifests" / "overlays" / "local-examples"
    cluster.kubectl("apply", "-k", str(overlay))
    try:
        cluster.kubectl(
            "-n", "baton-demo", "wait", "--for=condition=complete", "job/grpo-tenant",
            "--timeout=150s", timeout=160,
        )  # fmt: skip
        logs = cluster.kubectl("-n", "baton-demo", "logs", "-l", "job-name=grpo-tenant")
        assert "done:" in logs
        # ...in the slim tenant image (baton-client, none of the daemons' dependencies)
        jsonpath = "jsonpath={.items[*].status.containerStatuses[*].image}"
        ran = cluster.kubectl("-n", "baton-demo", "get", "pods", "-l", "job-name=grpo-tenant",
                              "-o", jsonpath).split()  # fmt: skip
        assert len(ran) == 3 and {i.split("/")[-1] for i in ran} == {images.TENANT_IMAGE}, ran
    finally:
        cluster.kubectl("delete", "namespace", "baton-demo", "--wait=true", timeout=90)

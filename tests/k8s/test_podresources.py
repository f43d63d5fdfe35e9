"""Many tenant pods at once over two GPUs: env, annotations and the kubelet's device IDs agree."""

from __future__ import annotations

import json

from baton.contract import names
from tests.k8s.cluster import Cluster, wait_for
from tests.k8s.pods import report, sleeper_pod

PODS = 8
"""Every slot of the node's two 4-slot GPUs."""


def test_burst_of_tenants_agrees_with_the_kubelet(cluster: Cluster, namespace: str) -> None:
    """The kubelet's device IDs decide; env, both annotations agree (after reconciling)."""
    pods = [f"burst-{i}" for i in range(PODS)]
    cluster.apply(*(sleeper_pod(name, namespace, duty=10) for name in pods))
    for name in pods:
        cluster.wait_phase(namespace, name, {"Running"}, 120)
    allocations = cluster.kubelet_allocations()

    def disagreements() -> list[str]:
        found = []
        for name in pods:
            pod = cluster.pod(namespace, name)
            notes = pod["metadata"].get("annotations") or {}
            env = report(cluster.logs(namespace, name))
            assigned = notes.get(names.ANNOTATION_ASSIGNED_GPUS)
            per_container = json.loads(notes.get(names.ANNOTATION_CONTAINER_GPUS, "{}"))
            kubelet = sorted(
                {d.split("::")[0] for d in allocations[(pod["metadata"]["uid"], "trainer")]}
            )
            seen = (env.get(names.ENV_GPUS), env.get(names.ENV_NVIDIA_VISIBLE_DEVICES), assigned)
            if (
                len(set(seen)) != 1
                or [assigned] != kubelet
                or per_container.get("trainer") != kubelet
            ):
                found.append(
                    f"{name}: env/visible/annotation {seen}, {per_container}, kubelet {kubelet}"
                )
        return found

    def agreeing() -> bool | None:
        return True if not disagreements() else None

    try:
        wait_for("every pod's GPUs to agree with the kubelet", agreeing, 30)
    except AssertionError:
        raise AssertionError("\n".join(disagreements())) from None

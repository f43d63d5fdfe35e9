"""A job's plan from its pods as the API server has them (`ClusterView.plan` over `member_of`):
which pods take part in its turns and which GPUs they cover, without agents."""

from __future__ import annotations

from typing import Any

import pytest

from baton.contract.names import ANNOTATION_ASSIGNED_GPUS, LABEL_JOB, RESOURCE_GPU
from coordinator.cluster import ClusterView, Node, PlanError, member_of

NODE = Node("n1", "10.0.0.1:9464", ("GPU-a", "GPU-b"))


def pod(name: str, gpus: str = "", claims: bool = False, asks: bool = True) -> dict[str, Any]:
    """A pod of job `rl` on n1: Baton assigned it `gpus` (none: its node's DRA claims name
    them), `claims` a DRA resource claim, `asks` a `baton.dev/gpu` slot."""
    container: dict[str, Any] = {"name": "main"}
    if asks:
        container["resources"] = {"limits": {RESOURCE_GPU: "1"}}
    spec: dict[str, Any] = {"nodeName": "n1", "containers": [container]}
    if claims:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}]
    annotations = {ANNOTATION_ASSIGNED_GPUS: gpus} if gpus else {}
    meta = {"namespace": "team", "name": name, "labels": {LABEL_JOB: "rl"}}
    return {"metadata": {**meta, "annotations": annotations}, "spec": spec}


def view(*pods: dict[str, Any]) -> ClusterView:
    found = ClusterView()
    found.nodes[NODE.name] = NODE
    for each in pods:
        read = member_of(each)
        assert read is not None
        found.members[read[2].pod] = read
    return found


def test_two_pods_of_a_job_on_gpus_of_their_own_are_both_planned() -> None:
    plan = view(pod("trainer", "GPU-a"), pod("sampler", "GPU-b")).plan("team", "rl")
    assert plan.pods == {"n1": ("team/sampler", "team/trainer")}
    assert plan.resources == ("n1/GPU-a", "n1/GPU-b")


def test_two_pods_of_a_job_that_baton_put_on_one_gpu_are_refused_naming_both() -> None:
    with pytest.raises(PlanError, match="pods team/sampler and team/trainer of job team/rl share"):
        view(pod("trainer", "GPU-a"), pod("sampler", "GPU-a")).plan("team", "rl")


def test_two_pods_of_a_job_on_a_dra_node_are_planned_their_agent_knowing_their_gpus() -> None:
    """On a DRA node the coordinator knows no pod's GPUs (every GPU of the node stands for
    them): two pods of one job there, each with a claim of its own, are not taken to share one."""
    dra = [pod(name, claims=True, asks=False) for name in ("trainer", "sampler")]
    plan = view(*dra).plan("team", "rl")
    assert plan.pods == {"n1": ("team/sampler", "team/trainer")}
    assert plan.resources == ("n1/GPU-a", "n1/GPU-b")


def test_a_pod_of_the_job_that_asks_for_no_gpu_is_not_planned() -> None:
    plan = view(pod("trainer", "GPU-a"), pod("driver", asks=False)).plan("team", "rl")
    assert plan.pods == {"n1": ("team/trainer",)}
    with pytest.raises(PlanError, match=r"none of its pods asks for a Baton GPU \(team/driver\)"):
        view(pod("driver", asks=False)).plan("team", "rl")

"""`kubectl baton why POD`: the scheduler's reason (with DRA's numbers) while Pending, the
agent's while the pod waits for a turn."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from typer.testing import CliRunner

from baton.contract import names
from commands.kubectl import cli
from commands.kubectl.api import Forbidden
from commands.kubectl.dra import device_line, shortfall
from commands.kubectl.why import why
from dra.slices import device
from nodegpu.inventory import NodeGpu
from tests.kubectl.fake import GIB, GPU_A, DictApi, cluster_routes


def pod(name: str, node: str | None = None, phase: str = "Pending", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {}}], **spec},
        "status": {"phase": phase},
    }


def event(message: str, at: str) -> dict[str, Any]:
    return {
        "reason": "FailedScheduling",
        "message": message,
        "lastTimestamp": at,
        "source": {"component": "baton-scheduler"},
    }


def test_pending_pod_gets_the_latest_scheduler_reason() -> None:
    routes = {
        "/api/v1/namespaces/ml/pods/p": pod("p"),
        "/api/v1/namespaces/ml/events": {
            "items": [
                event("0/1 nodes are available: old", "2026-01-01T00:00:00Z"),
                event("0/1 nodes are available: 1 GPU lacks 8 GiB", "2026-01-01T00:00:09Z"),
            ]
        },
    }
    api = DictApi(routes)
    answer = why(api, "ml", "p")
    assert answer["stage"] == "scheduling"
    assert answer["reasons"] == ["baton-scheduler: 0/1 nodes are available: 1 GPU lacks 8 GiB"]
    assert (
        "/api/v1/namespaces/ml/events",
        {"fieldSelector": "involvedObject.name=p,involvedObject.uid=uid-p"},
    ) in api.asked


def series_event(message: str, first: str, last: str) -> dict[str, Any]:
    """A FailedScheduling event as kube-scheduler records it (events.k8s.io/v1, read as v1):
    `eventTime` when first seen, the repeats under `series`, no `lastTimestamp`."""
    return {
        "reason": "FailedScheduling",
        "message": message,
        "eventTime": first,
        "lastTimestamp": None,
        "series": {"count": 4, "lastObservedTime": last},
        "source": {"component": "baton-scheduler"},
    }


def test_the_latest_reason_is_the_one_seen_last_though_first_seen_earlier() -> None:
    """The scheduler said A, then B once, then A again (A's event's series): A is its reason
    now. Sorted by when each was first seen, B was shown."""
    routes = {
        "/api/v1/namespaces/ml/pods/p": pod("p"),
        "/api/v1/namespaces/ml/events": {
            "items": [
                series_event(
                    "0/1 nodes are available: 1 GPU lacks 8 GiB",
                    "2026-01-01T00:00:00.000000Z",
                    "2026-01-01T00:05:00.250000Z",
                ),
                event("0/1 nodes are available: no GPU slot free", "2026-01-01T00:02:00Z"),
            ]
        },
    }
    assert why(DictApi(routes), "ml", "p")["reasons"] == [
        "baton-scheduler: 0/1 nodes are available: 1 GPU lacks 8 GiB"
    ]


def _device(index: int, memory_gib: int, slots: int = 4) -> dict[str, Any]:
    memory = memory_gib * GIB
    return {
        "name": f"gpu-{index}",
        "attributes": {"uuid": {"string": f"GPU-{index}"}},
        "capacity": {
            "memory": {"value": str(memory * slots), "requestPolicy": {"default": str(memory)}},
            "duty": {"value": "100", "requestPolicy": {"default": "25"}},
            "slots": {"value": str(slots), "requestPolicy": {"default": "1"}},
        },
    }


def _allocated(device: str, memory_gib: int, duty: int) -> dict[str, Any]:
    result = {
        "driver": names.DRA_DRIVER,
        "pool": "n1",
        "device": device,
        "consumedCapacity": {"memory": f"{memory_gib}Gi", "duty": str(duty)},
    }
    return {"status": {"allocation": {"devices": {"results": [result]}}}}


def test_dra_refusal_gets_each_devices_numbers() -> None:
    slices = [{"spec": {"pool": {"name": "n1"}, "devices": [_device(0, 80), _device(1, 80)]}}]
    claims = [_allocated("gpu-0", 40, 80), _allocated("gpu-1", 300, 10)]
    ask = {"memory": 30 * GIB, "duty": 30, "slots": None}
    lines = shortfall(slices, claims, [ask])  # type: ignore[list-item]
    assert lines == [
        "n1/gpu-0 (GPU-0): lacks duty (20% free of 100%, 30% asked)",
        "n1/gpu-1 (GPU-1): lacks memory (20.0 GiB free of 320.0 GiB, 30.0 GiB asked)",
    ]


def test_an_ask_the_slice_cannot_take_is_named_not_said_to_fit() -> None:
    """The slice caps one share's memory at the GPU's and duty at 100: the scheduler refuses
    a 90 GiB claim on an 80 GiB GPU however much memory capacity is free, and a device to a
    claim naming a capacity it lacks (`vram`), so `why` must say so (it said "has room for the
    ask"). An ask under the range's minimum consumes the minimum."""
    published = [
        {
            "spec": {
                "pool": {"name": "n1"},
                "devices": [device(NodeGpu("G", 0, "m", 81920), 4, None)],
            }
        }
    ]
    cases = [
        (
            {"memory": 90 * GIB},
            "n1/gpu-0 (G): lacks memory (at most 80.0 GiB per share, 90.0 GiB asked)",
        ),
        ({"duty": Decimal(150)}, "n1/gpu-0 (G): lacks duty (at most 100% per share, 150% asked)"),
        ({"slots": Decimal(2)}, "n1/gpu-0 (G): lacks slots (at most 1 per share, 2 asked)"),
        ({"memory": 80 * GIB}, "n1/gpu-0 (G): has room for the ask"),
        (
            {"vram": 30 * GIB, "memory": None},
            "n1/gpu-0 (G): has no capacity vram (it has duty, memory, slots)",
        ),
    ]
    for ask, line in cases:
        assert shortfall(published, [], [ask]) == [line]  # type: ignore[list-item]
    assert shortfall(published, [_allocated("gpu-0", 10, 100)], [{"duty": Decimal(0)}]) == [
        "n1/gpu-0 (G): lacks duty (0% free of 100%, 1% asked)"
    ]


def test_dra_refusal_through_why_reads_slices_claims_and_the_pods_claim() -> None:
    pending = pod("d", resourceClaims=[{"name": "gpu", "resourceClaimName": "d-gpu"}])
    ask = {"deviceClassName": names.DRA_DEVICE_CLASS, "capacity": {"requests": {"duty": "90"}}}
    routes = {
        "/api/v1/namespaces/ml/pods/d": pending,
        "/api/v1/namespaces/ml/events": {
            "items": [event("0/1 nodes are available: 1 cannot allocate all claims.", "t")]
        },
        "/apis/resource.k8s.io/v1/resourceslices": {
            "items": [{"spec": {"pool": {"name": "n1"}, "devices": [_device(0, 80)]}}]
        },
        "/apis/resource.k8s.io/v1/resourceclaims": {"items": [_allocated("gpu-0", 10, 20)]},
        "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/d-gpu": {
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": ask}]}}
        },
    }
    answer = why(DictApi(routes), "ml", "d")
    assert answer["reasons"][1] == "n1/gpu-0 (GPU-0): lacks duty (80% free of 100%, 90% asked)"


def test_dra_numbers_the_user_may_not_read_leave_the_schedulers_reason_and_name_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A user who may read the pod and its events, but not every namespace's claims or the
    driver's slices, gets the scheduler's reason and one line naming the permission missing."""
    refused = Forbidden(
        'forbidden: resourceslices.resource.k8s.io is forbidden: User "bob" cannot list '
        'resource "resourceslices" in API group "resource.k8s.io" at the cluster scope'
    )
    routes: dict[str, Any] = {
        "/api/v1/namespaces/ml/pods/d": pod("d"),
        "/api/v1/namespaces/ml/events": {
            "items": [event("0/1 nodes are available: 1 cannot allocate all claims.", "t")]
        },
        "/apis/resource.k8s.io/v1/resourceslices": refused,
    }
    monkeypatch.setattr(cli.Settings, "make_api", lambda kubeconfig, context: DictApi(routes))
    result = CliRunner().invoke(cli.app, ["why", "ml/d"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "ml/d (Pending), scheduling:",
        "  baton-scheduler: 0/1 nodes are available: 1 cannot allocate all claims.",
        f"  DRA's numbers per device are not shown: {refused}",
    ]


def test_running_pod_waiting_for_a_turn_gets_the_agents_why() -> None:
    routes = cluster_routes()
    routes["/api/v1/namespaces/ml/pods/b"] = pod("b", node="n1", phase="Running")
    routes["/api/v1/namespaces/ml/pods/a"] = pod("a", node="n1", phase="Running")
    waiting = why(DictApi(routes), "ml", "b")
    assert waiting["stage"] == "turn"
    assert waiting["reasons"] == [f"{GPU_A}: waits 0.7 s: position 1 (behind ml/a)"]
    holding = why(DictApi(routes), "ml", "a")
    assert holding["reasons"] == [f"{GPU_A}: holds the turn (1.5 s so far)"]
    routes["/api/v1/namespaces/ml/pods/z"] = pod("z", node="n1", phase="Running")
    unknown = why(DictApi(routes), "ml", "z")["reasons"][0]
    assert unknown.startswith("the agent on n1 does not know ml/z")


def test_a_claim_naming_a_capacity_no_device_has_is_said_so_through_why() -> None:
    pending = pod("v", resourceClaims=[{"name": "gpu", "resourceClaimName": "v-gpu"}])
    ask = {"deviceClassName": names.DRA_DEVICE_CLASS, "capacity": {"requests": {"vram": "30Gi"}}}
    routes = {
        "/api/v1/namespaces/ml/pods/v": pending,
        "/api/v1/namespaces/ml/events": {
            "items": [event("0/1 nodes are available: 1 cannot allocate all claims.", "t")]
        },
        "/apis/resource.k8s.io/v1/resourceslices": {
            "items": [{"spec": {"pool": {"name": "n1"}, "devices": [_device(0, 80)]}}]
        },
        "/apis/resource.k8s.io/v1/resourceclaims": {"items": []},
        "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/v-gpu": {
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": ask}]}}
        },
    }
    answer = why(DictApi(routes), "ml", "v")
    assert answer["reasons"][1] == (
        "n1/gpu-0 (GPU-0): has no capacity vram (it has duty, memory, slots)"
    )


def test_a_pod_held_back_for_a_claim_that_does_not_exist_says_which() -> None:
    """kube-scheduler does not try a pod whose claim is missing and records nothing; `why` said
    only "the scheduler has said nothing"."""
    pending = pod(
        "m",
        resourceClaims=[
            {"name": "gpu", "resourceClaimName": "typo"},
            {"name": "more", "resourceClaimTemplateName": "baton-gpu-3g"},
            {"name": "made", "resourceClaimName": "there"},
        ],
    )
    refused = {
        "reason": "FailedResourceClaimCreation",
        "message": 'PodResourceClaim more: resource claim template "baton-gpu-3g": not found',
        "lastTimestamp": "t",
    }
    routes = {
        "/api/v1/namespaces/ml/pods/m": pending,
        "/api/v1/namespaces/ml/events": {"items": [refused]},
        "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/there": {"spec": {}},
    }
    assert why(DictApi(routes), "ml", "m")["reasons"] == [
        "waits for claim ml/typo, which does not exist",
        "waits for the claim from template ml/baton-gpu-3g: PodResourceClaim more: resource"
        ' claim template "baton-gpu-3g": not found',
    ]
    routes["/api/v1/namespaces/ml/pods/m"] = pod("m")
    assert why(DictApi(routes), "ml", "m")["reasons"] == [
        "not scheduled yet: the scheduler has said nothing"
    ]


def test_a_name_no_pod_or_namespace_can_have_is_refused_before_asking(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = DictApi(cluster_routes())
    monkeypatch.setattr(cli.Settings, "make_api", lambda kubeconfig, context: api)
    for args, said in (
        (["why", "ml/"], "pod '' is not a Kubernetes name (lower-case letters, digits, '-', '.';"),
        (["why", ""], "pod '' is not"),
        (["why", "p?watch=1"], "pod 'p?watch=1' is not"),
        (["why", "ml/p/log"], "pod 'p/log' is not"),
        (["why", "p", "-n", "ML"], "namespace 'ML' is not a Kubernetes name (lower-case letters"),
        (["--baton-namespace", "a/b", "status"], "--baton-namespace 'a/b' is not"),
        (["usage", "-n", "ML_Team"], "namespace 'ML_Team' is not a Kubernetes name"),  # was
        (["-n", "ml.team", "usage"], "namespace 'ml.team' is not a Kubernetes name"),  # no rows
    ):
        result = CliRunner().invoke(cli.app, args)
        assert result.exit_code == 2, (args, result.output)
        [line] = result.output.splitlines()
        assert line.startswith(f"kubectl baton: {said}"), line
    assert api.asked == []


def test_a_pod_with_two_claims_is_shown_what_both_would_take_of_one_device() -> None:
    """The scheduler gives each claim a share of a device: two claims asking 60% duty each
    cannot both have one GPU with 100% free, and DRA refuses a one-GPU node. `why` compared the
    device with the larger single ask and said it "has room for the ask"; a device that holds
    one share but not both says so (on a node of several GPUs the scheduler may give the
    requests two of them). The shares of one request (its `count`) go to distinct devices, so a
    device takes one of them."""
    pending = pod(
        "two",
        resourceClaims=[
            {"name": "a", "resourceClaimName": "two-a"},
            {"name": "b", "resourceClaimName": "two-b"},
        ],
    )
    ask = {"deviceClassName": names.DRA_DEVICE_CLASS, "capacity": {"requests": {"duty": "60"}}}
    counted = {**ask, "count": 2, "capacity": {"requests": {"duty": "30"}}}
    routes = {
        "/api/v1/namespaces/ml/pods/two": pending,
        "/api/v1/namespaces/ml/events": {
            "items": [event("0/1 nodes are available: 1 cannot allocate all claims.", "t")]
        },
        "/apis/resource.k8s.io/v1/resourceslices": {
            "items": [{"spec": {"pool": {"name": "n1"}, "devices": [_device(0, 80)]}}]
        },
        "/apis/resource.k8s.io/v1/resourceclaims": {"items": []},
        "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/two-a": {
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": ask}]}}
        },
        "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/two-b": {
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": ask}]}}
        },
    }
    answer = why(DictApi(routes), "ml", "two")
    assert answer["reasons"][1] == (
        "n1/gpu-0 (GPU-0): has room for one share, not the pod's 2 together: duty (100% free "
        "of 100%, 120% asked by the pod's 2 requests)"
    )
    # b asks two devices of 30%: one device takes a's share and one of b's (90%).
    routes["/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/two-b"] = {
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": counted}]}}
    }
    assert why(DictApi(routes), "ml", "two")["reasons"][1] == (
        "n1/gpu-0 (GPU-0): has room for the ask"
    )


def test_a_device_is_weighed_against_each_request_of_the_pod_on_its_own_first() -> None:
    """Request a asks 70 GiB and 10% duty, b 5 GiB and 90%; the device has 120 GiB and 50%
    free: a fits it alone (the larger ask of each capacity, taken across requests, fits none)."""
    gib = Decimal(1 << 30)
    device = {
        "name": "gpu-0",
        "capacity": {"memory": {"value": str(160 * (1 << 30))}, "duty": {"value": "100"}},
    }
    used = {"memory": 40 * gib, "duty": Decimal(50)}
    asks = [{"memory": 70 * gib, "duty": Decimal(10)}, {"memory": 5 * gib, "duty": Decimal(90)}]
    assert device_line("n1", device, used, asks) == (
        "n1/gpu-0: has room for one share, not the pod's 2 together: duty (50% free of 100%, "
        "100% asked by the pod's 2 requests)"
    )
    assert device_line("n1", device, used, asks[1:]) == (
        "n1/gpu-0: lacks duty (50% free of 100%, 90% asked)"
    )

"""Reading a pod's DRA claims: which container holds which device, and its share."""

from __future__ import annotations

from baton.contract import names
from baton.contract.draclaim import (
    ClaimRef,
    ClaimShare,
    claim_shares,
    device_uuids,
    pod_claim_refs,
    pod_dra_ask,
)


def _claim(*results: dict[str, object]) -> dict[str, object]:
    return {"status": {"allocation": {"devices": {"results": list(results)}}}}


def test_claim_shares_reads_our_results_only() -> None:
    claim = _claim(
        {
            "request": "gpu",
            "driver": names.DRA_DRIVER,
            "pool": "n1",
            "device": "gpu-1",
            "shareID": "abc",
            "consumedCapacity": {"memory": "30Gi", "duty": "30", "slots": "1"},
        },
        {"request": "nic", "driver": "other.example.com", "pool": "n1", "device": "eth0"},
    )
    assert claim_shares(claim) == (ClaimShare("gpu", "n1", "gpu-1", "abc", 30 * 1024**3, 30.0),)


def test_claim_not_allocated_has_no_shares() -> None:
    assert claim_shares({"status": {}}) == ()
    assert claim_shares({}) == ()


def test_pod_claim_refs_template_direct_and_extended() -> None:
    pod = {
        "metadata": {"namespace": "ns"},
        "spec": {
            "resourceClaims": [
                {"name": "a", "resourceClaimTemplateName": "t"},
                {"name": "b", "resourceClaimName": "shared"},
                {"name": "c", "resourceClaimTemplateName": "t"},
            ],
            "initContainers": [{"name": "init", "resources": {"claims": [{"name": "b"}]}}],
            "containers": [
                {"name": "main", "resources": {"claims": [{"name": "a"}, {"name": "b"}]}},
                {"name": "late", "resources": {"claims": [{"name": "c"}]}},
                {"name": "plain"},
            ],
        },
        "status": {
            "resourceClaimStatuses": [{"name": "a", "resourceClaimName": "pod-a-xyz"}],
            "extendedResourceClaimStatus": {
                "resourceClaimName": "pod-extended-resources-q",
                "requestMappings": [
                    {
                        "containerName": "plain",
                        "resourceName": names.RESOURCE_GPU,
                        "requestName": "r0",
                    }
                ],
            },
        },
    }
    assert pod_claim_refs(pod) == {
        "init": (ClaimRef("ns", "shared"),),
        "main": (ClaimRef("ns", "pod-a-xyz"), ClaimRef("ns", "shared")),
        "plain": (ClaimRef("ns", "pod-extended-resources-q"),),
    }


def test_pod_dra_ask_devices_per_container_and_largest_share() -> None:
    a, b = ClaimRef("ns", "a"), ClaimRef("ns", "b")
    shares = {
        a: (ClaimShare("gpu", "n1", "gpu-0", "s1", 20 * names.MIB, 30.0),),
        b: (
            ClaimShare("gpu", "n1", "gpu-1", "s2", 40 * names.MIB, 10.0),
            ClaimShare("gpu", "other-node", "gpu-3", "s3", 90 * names.MIB, 90.0),
        ),
    }
    ask = pod_dra_ask({"x": (a, b), "y": (b,), "z": ()}, shares, "n1")
    assert ask.container_devices == {"x": ("gpu-0", "gpu-1"), "y": ("gpu-1",)}
    assert (ask.memory_mib, ask.duty) == (40, 30.0)


def test_pod_dra_ask_without_capacity_means_defaults() -> None:
    ref = ClaimRef("ns", "a")
    ask = pod_dra_ask({"x": (ref,)}, {ref: (ClaimShare("gpu", "n1", "gpu-0"),)}, "n1")
    assert (ask.memory_mib, ask.duty) == (None, None)
    assert pod_dra_ask({}, {}, "n1").memory_mib is None


def test_device_uuids_from_our_slices() -> None:
    slices = [
        {
            "spec": {
                "driver": names.DRA_DRIVER,
                "devices": [
                    {"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-a"}}},
                    {"name": "gpu-1", "attributes": {}},
                ],
            }
        },
        {
            "spec": {
                "driver": "x",
                "devices": [{"name": "gpu-9", "attributes": {"uuid": {"string": "Z"}}}],
            }
        },
    ]
    assert device_uuids(slices) == {"gpu-0": "GPU-a"}

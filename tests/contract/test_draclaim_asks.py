"""What a pending pod's claims ask of Baton's class, and whom an allocated claim serves."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from baton.contract import names
from baton.contract.draclaim import (
    ClaimAsk,
    ClaimRef,
    claim_asks,
    claim_ref,
    device_index,
    reserved_pods,
)


def _claim(*requests: Mapping[str, object], status: Mapping[str, object] | None = None) -> dict:
    return {
        "metadata": {"namespace": "ml", "name": "job-gpu"},
        "spec": {"devices": {"requests": list(requests)}},
        "status": status or {},
    }


def _exactly(name: str, **exactly: object) -> dict[str, object]:
    return {"name": name, "exactly": {"deviceClassName": names.DRA_DEVICE_CLASS, **exactly}}


@pytest.mark.parametrize(
    ("request_", "ask"),
    [
        (
            _exactly("gpu", capacity={"requests": {"memory": "30Gi", "duty": "30"}}),
            ClaimAsk("gpu", 1, 30 * 1024**3, 30.0),
        ),
        # The claim generated for a plain `baton.dev/gpu` limit names no capacity: defaults.
        (_exactly("container-0-request-0", count=2), ClaimAsk("container-0-request-0", 2, None)),
        (_exactly("gpu", capacity={"requests": {"duty": "12.5"}}), ClaimAsk("gpu", 1, None, 12.5)),
    ],
)
def test_claim_asks_read_memory_duty_and_count(request_: dict, ask: ClaimAsk) -> None:
    assert claim_asks(_claim(request_)) == (ask,)


def test_claim_asks_skip_other_classes_and_shapes() -> None:
    other = {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}}
    first_available = {"name": "any", "firstAvailable": [{"deviceClassName": "x"}]}
    assert claim_asks(_claim(other, first_available)) == ()
    assert claim_asks({}) == ()


def test_claim_asks_refuse_a_capacity_that_is_no_quantity() -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        claim_asks(_claim(_exactly("gpu", capacity={"requests": {"memory": "lots"}})))


def test_reserved_pods_and_ref() -> None:
    claim = _claim(
        status={
            "reservedFor": [
                {"resource": "pods", "name": "a", "uid": "u1"},
                {"resource": "jobs", "name": "j", "uid": "u2"},
                {"resource": "pods", "name": "b"},
            ]
        }
    )
    assert reserved_pods(claim) == ("u1",)
    assert reserved_pods(_claim()) == ()
    assert claim_ref(claim) == ClaimRef("ml", "job-gpu")


@pytest.mark.parametrize(
    ("device", "index"), [("gpu-0", 0), ("gpu-13", 13), ("gpu-", None), ("nic-1", None)]
)
def test_device_index(device: str, index: int | None) -> None:
    assert device_index(device) == index

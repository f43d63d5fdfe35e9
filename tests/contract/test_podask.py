"""Reading a pod's Baton request from its containers."""

from __future__ import annotations

import copy
from decimal import Decimal

import pytest

from baton.contract.podask import (
    ContainerAsk,
    ContainerKind,
    RequestError,
    RequestMemo,
    TenantRequest,
    parse_pod_request,
    parse_quantity,
    read_pod_ask,
)
from tests.extender.builders import pod


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("40960", Decimal(40960)),
        ("64Gi", Decimal(64 * 2**30)),
        ("1G", Decimal(10**9)),
        ("1e3", Decimal(1000)),
        ("500m", Decimal("0.5")),
        ("1.5Ki", Decimal(1536)),
    ],
)
def test_quantities(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"gpus": 1}, TenantRequest(1, None, None, 512 * 2**30)),
        ({"gpus": 2, "memory": 40960, "duty": 30}, TenantRequest(2, 40960, 30.0, 512 * 2**30)),
        ({"gpus": 1, "memory_limit": None}, TenantRequest(1, None, None, None)),
        ({"gpus": "1", "memory": "1e4"}, TenantRequest(1, 10000, None, 512 * 2**30)),
    ],
)
def test_requests_read(kwargs: dict, expected: TenantRequest) -> None:
    assert parse_pod_request(pod(**kwargs)) == expected


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gpus": "two"}, "baton.dev/gpu 'two' is not a number"),
        ({"gpus": -1}, "baton.dev/gpu -1: ask for at least 1 GPU"),
        ({"gpus": 0}, "baton.dev/gpu 0: ask for at least 1 GPU"),
        ({"gpus": 1000}, "more than 64 GPUs per pod"),
        ({"gpus": "1.5"}, "baton.dev/gpu 1.5 is not a whole number"),
        ({"memory": 0}, "baton.dev/gpu-memory 0 must be a positive number of MiB"),
        ({"memory": -5}, "baton.dev/gpu-memory -5 must be a positive"),
        ({"memory": "80Gi"}, "more than any GPU has (it counts MiB"),
        (
            {"memory": "24Gi"},
            "baton.dev/gpu-memory '24Gi' is 25769803776 MiB, more than any GPU has"
            " (it counts MiB: write 24576 for 24Gi",
        ),
        (
            {"memory": "24G"},
            "'24G' is 24000000000 MiB, more than any GPU has (it counts MiB: write 22889 for 24G",
        ),
        ({"memory": "40960Mi"}, "(it counts MiB: write 40960 for 40960Mi"),
        ({"memory": 81920000}, "81920000 MiB is more than any GPU has (it counts MiB"),
        ({"duty": 0}, "baton.dev/gpu-duty 0 is not above 0 and at most 100"),
        ({"duty": 150}, "baton.dev/gpu-duty 150 is not above 0 and at most 100"),
        ({"gpus": None, "memory": 1000}, "baton.dev/gpu-memory is set but baton.dev/gpu is not"),
        ({"memory_limit": "lots"}, "memory limit 'lots' is not a quantity"),
        # Exponents past what Decimal holds (the API server keeps them as written).
        ({"memory": "1e1000000"}, "baton.dev/gpu-memory '1e1000000' is not a number"),
        ({"duty": "1e-9999999"}, "baton.dev/gpu-duty '1e-9999999' is not a number"),
        ({"memory_limit": "1e1000000"}, "memory limit '1e1000000' is not a quantity"),
    ],
)
def test_bad_requests_name_the_field(kwargs: dict, message: str) -> None:
    with pytest.raises(RequestError, match=message.replace("(", r"\(").replace(".", r"\.")):
        parse_pod_request(pod(**kwargs))


def test_a_summed_duty_above_100_names_each_containers_ask() -> None:
    """Two containers of 60 each read "gpu-duty 120 is not above 0 and at most 100": a number
    the user never wrote."""
    two = pod(gpus=1, duty=60)
    two["spec"]["containers"].append({**two["spec"]["containers"][0], "name": "second"})
    two["spec"]["initContainers"] = [
        {
            "name": "warmup",
            "resources": {"limits": {"baton.dev/gpu": "1", "baton.dev/gpu-duty": "90"}},
        }
    ]
    with pytest.raises(RequestError) as refused:
        parse_pod_request(two)
    assert str(refused.value) == (
        "baton.dev/gpu-duty 120 is not above 0 and at most 100 (percent): the pod's containers"
        " ask 60 + 60, and those running together add up"
    )


def test_pod_without_baton_resources_is_not_a_tenant() -> None:
    assert parse_pod_request(pod(gpus=None)) is None


def test_containers_sum_and_init_containers_count_like_kube_scheduler() -> None:
    two = pod(gpus=1, memory=1000, duty=20)
    container = two["spec"]["containers"][0]
    two["spec"]["containers"].append({**container, "name": "sidecar"})
    init = {**container, "name": "warmup"}
    init["resources"] = {"limits": {"baton.dev/gpu": "3", "memory": "1Gi"}}
    two["spec"]["initContainers"] = [init]
    request = parse_pod_request(two)
    assert request == TenantRequest(3, 2000, 40.0, 2 * 512 * 2**30 + 2**30)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nonsense", "pod spec is not an object"),
        ({"containers": "main"}, "pod spec.containers is not a list of objects"),
        ({"containers": [{"resources": []}]}, "pod container resources is not an object"),
        (
            {"containers": [{"resources": {"limits": ["baton.dev/gpu"]}}]},
            "pod container resources.limits is not an object",
        ),
    ],
)
def test_malformed_pods_are_request_errors(spec: object, message: str) -> None:
    with pytest.raises(RequestError, match=message.replace(".", r"\.")):
        parse_pod_request({"metadata": {"name": "p"}, "spec": spec})


def test_the_memo_answers_as_the_parser_and_reads_a_resize_afresh() -> None:
    memo = RequestMemo()
    first = pod(uid="u1", gpus=1, memory=8192, duty=20)
    assert memo.request(first) == parse_pod_request(first)
    assert len(memo) == 1
    resized = copy.deepcopy(first)
    resized["spec"]["containers"][0]["resources"]["limits"]["memory"] = "64Gi"
    assert memo.request(resized) == parse_pod_request(resized)
    assert memo.request(resized) != memo.request(first)
    memo.forget("u1")
    assert len(memo) == 0


def test_the_memo_remembers_an_unusable_request_and_still_says_why() -> None:
    memo = RequestMemo()
    bad = pod(uid="u1", gpus="1.5")
    for _ in range(2):
        with pytest.raises(RequestError, match="not a whole number"):
            memo.request(bad)


def test_the_memo_leaves_pods_without_uid_or_with_odd_shapes_to_the_parser() -> None:
    memo = RequestMemo()
    unnamed = pod(gpus=2)
    unnamed["metadata"].pop("uid")
    assert memo.request(unnamed) == TenantRequest(gpus=2, memory_limit_bytes=512 * 2**30)
    odd = pod(uid="u2")
    odd["spec"]["containers"] = ["not an object"]
    with pytest.raises(RequestError, match="not a list of objects"):
        memo.request(odd)
    assert len(memo) == 0


def test_the_memo_starts_over_when_full() -> None:
    memo = RequestMemo(size=2)
    for uid in ("a", "b", "c"):
        memo.request(pod(uid=uid))
    assert len(memo) == 1


def test_each_container_is_read_with_its_kind_and_memory_limit() -> None:
    spec = pod(gpus=1, memory=1000, duty=20)
    main = spec["spec"]["containers"][0]
    spec["spec"]["initContainers"] = [
        {"name": "proxy", "restartPolicy": "Always", "resources": {"limits": {"memory": "1Gi"}}},
        {"name": "warmup", "resources": {"requests": {"baton.dev/gpu": "2"}}},
    ]
    ask = read_pod_ask(spec)
    assert [(c.name, c.kind) for c in ask.containers] == [
        ("proxy", ContainerKind.SIDECAR),
        ("warmup", ContainerKind.INIT),
        (main["name"], ContainerKind.APP),
    ]
    assert ask.containers[0] == ContainerAsk(
        "proxy", ContainerKind.SIDECAR, None, None, None, 2**30
    )
    assert ask.containers[2].slots == 1 and ask.containers[2].duty == 20.0
    assert (ask.slots, ask.slot_asks) == (2, (2, 1))
    assert ask.memory_limit_bytes() is None  # warmup asks a GPU and has no memory limit


def test_an_init_container_after_a_sidecar_needs_room_beside_it() -> None:
    spec = pod(gpus=1)
    spec["spec"]["initContainers"] = [
        {"name": "s", "restartPolicy": "Always", "resources": {"limits": {"baton.dev/gpu": "2"}}},
        {"name": "i", "resources": {"limits": {"baton.dev/gpu": "2"}}},
    ]
    assert read_pod_ask(spec).slots == 4  # i runs beside s: 2 + 2 > s + main

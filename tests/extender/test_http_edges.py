"""Bodies at the edges of what JSON can carry (numbers past 64 bits, deep nesting, wrong types
where objects belong): each verb answers 200 or a 400 naming the field, never a 5xx."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from extender.app import create_app
from extender.cache import ClusterCache
from extender.metrics import Metrics
from extender.placement import Limits
from extender.server import ServerThread
from extender.state import ClusterState
from tests.extender.builders import node, pod

NODES = [node("node-a", gpus=2)]
POD = pod("p", gpus=1, memory=1000)
DEEP = "[" * 300 + "]" * 300
"""Deeper than orjson writes (254 levels), within what it reads (1024)."""
DEEPER = "[" * 1000 + "]" * 1000
"""Deeper than Python compares or prints (its recursion limit)."""


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    cache = ClusterCache.filled(ClusterState(Limits(), time.monotonic), NODES, [])
    with (
        ServerThread(create_app(cache, None, Metrics())) as server,
        httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=10) as c,
    ):
        yield c


def preempt(violations: str, pods: str = '[{"UID": "v"}]', meta: bool = True) -> str:
    key = "NodeNameToMetaVictims" if meta else "NodeNameToVictims"
    victims = f'{{"node-a": {{"Pods": {pods}, "NumPDBViolations": {violations}}}}}'
    return f'{{"Pod": {json.dumps(POD)}, "{key}": {victims}}}'


def node_list(item: str) -> str:
    return f'{{"Pod": {json.dumps(POD)}, "Nodes": {{"items": [{item}]}}, "NodeNames": null}}'


def limits(value: str, uid: str = "u", extra: str = "") -> str:
    resources = f'{{"limits": {{"baton.dev/gpu": "1", "memory": {value}}}{extra}}}'
    spec = f'{{"containers": [{{"name": "c", "resources": {resources}}}]}}'
    return f'{{"Pod": {{"metadata": {{"uid": "{uid}"}}, "spec": {spec}}}, "NodeNames": ["node-a"]}}'


REFUSED = [
    ("preempt", preempt("18446744073709551616"), "NumPDBViolations must be an int64"),
    ("preempt", preempt("9223372036854775808"), "NumPDBViolations must be an int64"),
    ("preempt", preempt("-9223372036854775809"), "NumPDBViolations must be an int64"),
    ("preempt", preempt("1e300"), "NumPDBViolations must be an int64"),
    ("preempt", preempt("1.5"), "NumPDBViolations must be an int64"),
    ("preempt", preempt('"3"'), "NumPDBViolations must be an int64"),
    ("preempt", preempt(DEEPER), "NumPDBViolations must be an int64"),
    ("filter", node_list(f'{{"metadata": {{"name": "node-a"}}, "x": {DEEP}}}'), "field Nodes"),
    ("filter", node_list('{"metadata": 5}'), "field Nodes"),
    ("filter", node_list('{"metadata": {"name": "n", "annotations": 5}}'), "annotations"),
    ("filter", node_list(f'{{"metadata": {{"name": "n", "annotations": {{"a": {DEEP}}}}}}}'), "n"),
    ("prioritize", '{"Pod": {"metadata": 5, "spec": {}}, "NodeNames": []}', "Pod.metadata"),
    ("preempt", '{"Pod": {"metadata": [], "spec": {}}, "NodeNameToVictims": {}}', "Pod.metadata"),
]


@pytest.mark.parametrize(("verb", "body", "named"), REFUSED)
def test_out_of_range_or_misshapen_fields_get_a_400_naming_them(
    client: httpx.Client, verb: str, body: str, named: str
) -> None:
    answer = client.post(f"/{verb}", content=body.encode())
    assert answer.status_code == 400, answer.text
    error = answer.json()["Error"]
    assert error.startswith(f"bad {verb} request: ") and named in error, error
    assert len(error) < 300, error


def test_the_largest_int64_pdb_violations_are_echoed_back(client: httpx.Client) -> None:
    for value in (2**63 - 1, -(2**63)):
        answer = client.post("/preempt", content=preempt(str(value)).encode())
        assert answer.status_code == 200, answer.text
        assert answer.json()["NodeNameToMetaVictims"]["node-a"]["NumPDBViolations"] == value


ODD_PODS = [
    limits(DEEPER),
    limits('"1"', extra=f', "x": {DEEPER}'),
    limits('{"x":' * 900 + "1" + "}" * 900),
    limits('"1"').replace('"baton.dev/gpu": "1"', '"baton.dev/gpu": "1e5000"'),
    limits('"' + "9" * 5000 + '"'),
    limits("1e300"),
    limits('"1e1000000"'),  # an exponent past what Decimal holds, above and below
    limits('"1"').replace('"baton.dev/gpu": "1"', '"baton.dev/gpu": "1e1000000"'),
    limits('"1"').replace('"baton.dev/gpu": "1"', '"baton.dev/gpu": "1e-9999999"'),
    limits('"1"').replace('"name": "c"', f'"name": {DEEPER}'),
]


@pytest.mark.parametrize("body", ODD_PODS)
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_values_too_deep_or_too_large_to_read_get_a_short_reason(
    client: httpx.Client, verb: str, body: str
) -> None:
    """Twice: the second reading compares the pod's resources with the first one's."""
    for _ in range(2):
        answer = client.post(f"/{verb}", content=body.encode())
        assert answer.status_code == 200, answer.text
        assert len(answer.content) < 600, answer.text
    if verb == "filter":
        reason: Any = answer.json()["FailedAndUnresolvableNodes"].get("node-a", "")
        assert "memory" in reason or "gpu" in reason or answer.json()["NodeNames"], reason

"""A filter for a pod whose claim the extender's watch has not shown yet waits (bounded) for it,
instead of refusing the pod into kube-scheduler's unschedulable queue."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from extender import app
from extender.app import create_app
from extender.cache import DRA_KINDS, ClusterCache
from extender.metrics import Metrics
from extender.server import ServerThread
from extender.state import ClusterState
from tests.extender.test_dra_state import claim, claim_pod, dra_state

FILTER: dict[str, Any] = {"Pod": claim_pod("new", "new-gpu"), "Nodes": None, "NodeNames": ["n1"]}


class WatchedCache(ClusterCache):
    """A cache that says when a filter starts waiting on it."""

    def __init__(self, state: ClusterState) -> None:
        super().__init__(state, DRA_KINDS)
        self.waiting = threading.Event()

    def wait_for(self, predicate: Callable[[ClusterState], bool], timeout_s: float) -> bool:
        self.waiting.set()
        return super().wait_for(predicate, timeout_s)


@pytest.fixture
def served() -> Iterator[tuple[WatchedCache, Metrics, str]]:
    cache = WatchedCache(dra_state())
    for kind in DRA_KINDS:
        cache.mark_synced(kind)
    metrics = Metrics()
    with ServerThread(create_app(cache, None, metrics)) as server:
        yield cache, metrics, f"http://127.0.0.1:{server.port}"


def post_filter(url: str) -> Any:
    return httpx.post(f"{url}/filter", json=FILTER, timeout=10).json()


def test_a_filter_waits_for_the_claim_watch_and_judges_the_pod_on_it(
    served: tuple[WatchedCache, Metrics, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, metrics, url = served
    monkeypatch.setattr(app, "CLAIM_WAIT_S", 60)  # the test, not the bound, ends the wait
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(post_filter, url)
        assert cache.waiting.wait(10), "the filter did not wait for the claim"
        assert not answer.done()
        with cache.changed:  # as the watch applies a change
            cache.state.upsert_claim(claim("new-gpu"))
            cache.changed.notify_all()
        result = answer.result(timeout=10)
    assert result["NodeNames"] == ["n1"] and not result["FailedNodes"], result
    assert 'baton_extender_claim_waits_total{outcome="seen"} 1.0' in metrics.render().decode()


def test_a_claim_the_watch_never_shows_is_named_after_the_wait(
    served: tuple[WatchedCache, Metrics, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, metrics, url = served
    monkeypatch.setattr(app, "CLAIM_WAIT_S", 0.05)
    result = post_filter(url)
    assert result["FailedNodes"] == {
        "n1": "claim default/new-gpu is not in the extender's cache yet"
    }
    assert cache.waiting.is_set()
    assert 'baton_extender_claim_waits_total{outcome="timeout"} 1.0' in metrics.render().decode()


def test_a_pod_whose_claims_are_known_does_not_wait(
    served: tuple[WatchedCache, Metrics, str],
) -> None:
    cache, _, url = served
    with cache.changed:
        cache.state.upsert_claim(claim("new-gpu"))
    assert post_filter(url)["NodeNames"] == ["n1"]
    assert not cache.waiting.is_set()


def test_no_wait_while_a_watch_is_failing(
    served: tuple[WatchedCache, Metrics, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, metrics, url = served
    monkeypatch.setattr(cache, "watching", lambda: False)
    result = post_filter(url)
    assert result["FailedNodes"] == {
        "n1": "claim default/new-gpu is not in the extender's cache yet"
    }
    assert not cache.waiting.is_set()
    assert 'baton_extender_claim_waits_total{outcome="timeout"} 0.0' in metrics.render().decode()


def test_a_pod_of_an_odd_shape_is_refused_naming_the_field_and_never_waited_for(
    served: tuple[WatchedCache, Metrics, str],
) -> None:
    cache, _, url = served
    for key, value, why in [
        ("status", {"resourceClaimStatuses": "x"}, "status.resourceClaimStatuses must be a list"),
        ("status", {"resourceClaimStatuses": ["x"]}, "resourceClaimStatuses must be a list of"),
        ("spec", "x", "pod field spec must be an object"),
        ("spec", {"resourceClaims": [{"name": ["gpu"]}]}, "the claim for ['gpu'] is not made yet"),
    ]:
        odd = {**FILTER, "Pod": {**FILTER["Pod"], key: value}}
        answer = httpx.post(f"{url}/filter", json=odd, timeout=10)
        assert answer.status_code == 200, answer.text
        assert why in answer.json()["FailedNodes"]["n1"], answer.text
    assert not cache.waiting.is_set()

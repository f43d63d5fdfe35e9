"""The bench's pod watch: a store for the reflector that records when each pod was seen bound."""

from __future__ import annotations

from typing import Any

import pytest

from baton.contract.reflector import WatchEvent
from commands.bench.fleet import BindWatch
from tests.harness.fakeapi import FakeApiServer


def pod(name: str, version: str, node: str = "") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version}, "spec": {"nodeName": node}}


class Core:
    """What BindWatch takes from a `CoreV1Api`: its client."""

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client


def test_bound_pods_are_recorded_once_from_the_list_and_the_watch(api_client: Any) -> None:
    watch = BindWatch(Core(api_client), "ns")
    watch.replace([pod("listed", "7", node="n1"), pod("pending", "7")], "7")
    watch.apply(WatchEvent("ADDED", pod("a", "10")))
    assert set(watch.bound) == {"listed"}
    watch.apply(WatchEvent("MODIFIED", pod("a", "11", node="n2")))
    first = watch.bound["a"]
    watch.apply(WatchEvent("MODIFIED", pod("a", "12", node="n2")))
    watch.apply(WatchEvent("DELETED", pod("listed", "13", node="n1")))
    assert set(watch.bound) == {"listed", "a"} and watch.bound["a"] == first
    watch.wait_bound(["listed", "a"], 0)
    with pytest.raises(TimeoutError, match="1 of 2 pods unbound"):
        watch.wait_bound(["a", "pending"], 0)


def test_follows_the_namespace_through_the_api(fake_api: FakeApiServer, api_client: Any) -> None:
    listed = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "b", "namespace": "ns"}}
    fake_api.put_object({**listed, "spec": {"nodeName": "n1"}})
    watch = BindWatch(Core(api_client), "ns").start()
    try:
        assert set(watch.bound) == {"b"}, "start() returns once listed"
        later = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "c", "namespace": "ns"}}
        fake_api.put_object({**later, "spec": {}})
        fake_api.put_object({**later, "spec": {"nodeName": "n2"}})
        watch.wait_bound(["c"], 10)
    finally:
        watch.stop()

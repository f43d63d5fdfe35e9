"""Fixtures for the extender's tests against the fake API server."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from extender.cache import KubeCache
from extender.placement import Limits
from extender.state import ClusterState
from tests.extender.http_wire import connect, gate, routes  # noqa: F401 (fixtures)

SYNC_TIMEOUT_S = 10.0


@pytest.fixture
def restarts() -> list[tuple[str, str]]:
    return []


@pytest.fixture
def kube_cache(api_client: Any, restarts: list[tuple[str, str]]) -> Iterator[KubeCache]:
    state = ClusterState(Limits(), time.monotonic)
    cache = KubeCache(state, api_client, on_restart=lambda kind, why: restarts.append((kind, why)))
    cache.start()
    try:
        assert cache.wait_synced(SYNC_TIMEOUT_S), "the cache did not list nodes and pods"
        yield cache
    finally:
        cache.stop()

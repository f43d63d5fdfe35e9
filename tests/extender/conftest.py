"""Fixtures for the extender's tests against the fake API server."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from baton.kube import load_api_client
from extender.cache import KubeCache
from extender.placement import Limits
from extender.state import ClusterState
from tests.harness.fakeapi import FakeApiServer

SYNC_TIMEOUT_S = 10.0


@pytest.fixture
def fake_api() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def api_client(fake_api: FakeApiServer, tmp_path: Path) -> Iterator[Any]:
    client = load_api_client(str(fake_api.kubeconfig_path(tmp_path)))
    try:
        yield client
    finally:
        client.close()


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

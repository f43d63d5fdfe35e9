"""Fixtures for the fake API server's own tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from baton.kube import load_api_client
from tests.harness.fakeapi import FakeApiServer


@pytest.fixture
def fake_api() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def core(fake_api: FakeApiServer, tmp_path: Path) -> Iterator[Any]:
    api_client = load_api_client(str(fake_api.kubeconfig_path(tmp_path)))
    try:
        yield client.CoreV1Api(api_client)
    finally:
        api_client.close()

"""Fixtures every area shares: the fake API server and a real client talking to it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from baton.contract.kube import load_api_client
from tests.harness.fakeapi import FakeApiServer


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

"""Fixtures for the fake API server's own tests."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client


@pytest.fixture
def core(api_client: Any) -> Any:
    return client.CoreV1Api(api_client)

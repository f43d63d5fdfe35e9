"""Fixtures of the DRA driver's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.drakubelet import DraKubeletStub


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[DraKubeletStub]:
    """The kubelet's side of the DRA plugin API, registering from `tmp_path`."""
    stub = DraKubeletStub(tmp_path / "plugins_registry")
    yield stub
    stub.close()

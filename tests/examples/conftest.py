"""Fixtures: a short directory for an agent's socket and state, removed after the test."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tests.harness.agent import short_tmpdir


@pytest.fixture
def workdir() -> Iterator[str]:
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)

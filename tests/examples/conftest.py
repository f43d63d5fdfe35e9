"""Fixtures: a short directory for an agent's socket and state, removed after the test; a TRL
job and another job that parks it, on one agent."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.examples.trl_jobs import Jobs, running_jobs
from tests.harness.agent import short_tmpdir


@pytest.fixture
def workdir() -> Iterator[str]:
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def jobs(tmp_path: Path, workdir: str) -> Iterator[Jobs]:
    """A watched TRL job's callback and another job that parks it (`tests.examples.trl_jobs`)."""
    with running_jobs(tmp_path, workdir) as running:
        yield running

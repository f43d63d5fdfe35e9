"""Fixtures every area shares: the fake API server and a real client talking to it; and the
Hypothesis profile every property and fuzz test runs under."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from baton.contract.kube import load_api_client
from tests.harness.agent import remove_short_tmpdirs
from tests.harness.fakeapi import FakeApiServer

HYPOTHESIS_PROFILE = "BATON_HYPOTHESIS_PROFILE"
settings.register_profile("deterministic", derandomize=True, database=None, print_blob=True)
settings.register_profile("random", derandomize=False, database=None, print_blob=True)
settings.load_profile(os.environ.get(HYPOTHESIS_PROFILE, "deterministic"))
"""`make test` and CI draw the same examples every run (each test's seed is a hash of the test,
no example database); `make soak` sets BATON_HYPOTHESIS_PROFILE=random and draws new ones."""


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Agents' directories under /tmp go with the session, whatever its tests' outcome."""
    remove_short_tmpdirs()


@pytest.fixture
def sigint_raises() -> Iterator[None]:
    """Ctrl-C (and `_thread.interrupt_main`) raises `KeyboardInterrupt` in the test, as in a
    terminal: a run started in the background inherits SIGINT ignored. Put back after."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


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

"""Fixtures every area shares: the fake API server and a real client talking to it; and the
Hypothesis profile every property and fuzz test runs under."""

from __future__ import annotations

import importlib.util
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


REAL_NODE = "tests/k8s/"
"""The real-node tests: one node at a time on fixed ports, each module after the last."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker (`make test`'s two), the real-node tests come first: the scheduler
    below hands them to one worker before anything else, the other takes the rest."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: not item.nodeid.startswith(REAL_NODE))  # (a stable sort)


def work_unit(nodeid: str) -> str:
    """What one xdist worker runs whole, in order: all the real-node tests, else a module (its
    fixtures set up once, its tests never racing each other)."""
    return "real-node" if nodeid.startswith(REAL_NODE) else nodeid.partition("::")[0]


if importlib.util.find_spec("xdist") is not None:  # (a dev extra: `make test` installs it)
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        """`--dist loadscope` with `work_unit`'s scopes."""

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
        return ByWorkUnit(config, log) if config.getvalue("dist") == "loadscope" else None


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

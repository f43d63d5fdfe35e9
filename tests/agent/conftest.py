"""Fixtures: a running agent on a temp socket, and a factory of tenant processes."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator, Sequence

import pytest

from tests.harness.agent import AgentRunner, TenantProcess, short_tmpdir

TenantFactory = Callable[..., TenantProcess]


@pytest.fixture
def workdir() -> Iterator[str]:
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def agent(workdir: str) -> Iterator[AgentRunner]:
    runner = AgentRunner(workdir).start()
    yield runner
    runner.stop()


@pytest.fixture
def tenants(agent: AgentRunner) -> Iterator[TenantFactory]:
    started: list[TenantProcess] = []

    def start(
        name: str, gpus: Sequence[str] = ("GPU-0",), socket: str | None = None
    ) -> TenantProcess:
        tenant = TenantProcess(socket or agent.socket, name, gpus)
        started.append(tenant)
        return tenant

    yield start
    for tenant in started:
        tenant.close()

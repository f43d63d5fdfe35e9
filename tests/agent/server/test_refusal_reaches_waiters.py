"""A real refusal reaches the waiter: on a fake-backend agent whose host budget cannot hold a
resident tenant's memory, a Baton client's timed-out acquire and llm-d's Acquire both say why,
with the numbers, before their deadlines."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from agent.client import AcquireTimeout, Baton
from baton.contract.names import fake_gpu_uuid
from commands.demo.fakenode import tenant_env
from tests.agent.server.llmd.llmd_client import TimeSliceOrchestratorClient
from tests.harness.agent import AgentRunner, one_small_fake_gpu

ROOT = Path(__file__).resolve().parents[3]
GPU = fake_gpu_uuid(0)
BUDGET = "over the 50 MiB budget"
TENANT = [sys.executable, "-m", "tests.agent.parking.tenant_proc"]
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def node(workdir: str) -> Iterator[tuple[AgentRunner, subprocess.Popen[str]]]:
    """An agent with a 100 MiB GPU and a 50 MiB host budget; a 60 MiB tenant resident on it."""
    parking = one_small_fake_gpu(workdir, host_memory_budget_mib=50)
    agent = AgentRunner(
        workdir, parking=parking, llmd_listen="127.0.0.1:0", llmd_groups=(f"jobs={GPU}",)
    ).start()
    resident = subprocess.Popen(
        [*TENANT, "--name", "resident", "--mib", "60", "--declare", "--turns", "1", "--linger"],
        cwd=ROOT,
        env=tenant_env(agent.config.socket, parking.fake_dir),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert resident.stdout is not None
        for _ in range(3):  # "turn", then "done": it holds its memory and lingers
            if '"done"' in resident.stdout.readline():
                break
        else:
            raise AssertionError("the resident tenant never finished its turn")
        yield agent, resident
    finally:
        resident.kill()
        resident.wait(10)
        for stream in (resident.stdin, resident.stdout):
            if stream is not None:
                stream.close()
        agent.stop()


def test_a_clients_timed_out_acquire_names_the_host_budget(
    node: tuple[AgentRunner, subprocess.Popen[str]],
) -> None:
    agent, _ = node
    waiter = Baton(agent.config.socket, [GPU], name="waiter", gpu_memory_mib=60)
    try:
        with pytest.raises(AcquireTimeout) as refused:
            waiter.acquire(timeout=1.0)
    finally:
        waiter.close()
    assert BUDGET in refused.value.reason, refused.value.reason
    assert "local/resident" in refused.value.reason
    expired = agent.wait_event(lambda e: e.kind == "expired" and e.tenant_id == "local/waiter")
    assert BUDGET in expired.detail


def test_llmds_acquire_answers_resource_exhausted_with_the_numbers_before_its_deadline(
    node: tuple[AgentRunner, subprocess.Popen[str]],
) -> None:
    agent, _ = node
    client = TimeSliceOrchestratorClient(f"127.0.0.1:{agent.llmd_port}", "job-a", "jobs")
    try:
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as refused:
            client.acquire(timeout_sec=2.0)
        took = time.monotonic() - started
    finally:
        client.close()
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value.details()
    assert BUDGET in str(refused.value.details())
    assert took < 2.0, "answered before the caller's deadline, not a bare DEADLINE_EXCEEDED"

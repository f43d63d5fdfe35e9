"""The example GRPO tenant: phase order, and two tenant processes taking turns on a real agent."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.assembly import Agent, AgentConfig, build_agent
from agent.client import LeaseInfo
from agent.client.errors import AgentUnavailable
from agent.examples.grpo_loop import Phases, across_agent_restarts, run
from agent.parking.setup import ParkingOptions
from baton.contract import names

GPU = "GPU-00000000-0000-0000-0000-000000000001"
ROOT = Path(__file__).resolve().parents[2]


class RecordingBaton:
    """Records the order of acquire, modelled work and yield."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.token = 0

    def acquire(self, timeout: float | None = None) -> LeaseInfo:
        self.token += 1
        self.log.append("acquire")
        return LeaseInfo("lease", (GPU,), {GPU: self.token}, 0.0, 0.0, False)

    def yield_(self) -> None:
        self.log.append("yield")


class RestartingBaton(RecordingBaton):
    """The agent restarts under the first acquire and the first yield."""

    def __init__(self, log: list[str]) -> None:
        super().__init__(log)
        self.failures = {"acquire": 1, "yield": 1}

    def _maybe_fail(self, call: str) -> None:
        if self.failures[call]:
            self.failures[call] -= 1
            self.log.append(f"{call} lost")
            raise AgentUnavailable("lost the Baton agent; reconnecting, retry the call")

    def acquire(self, timeout: float | None = None) -> LeaseInfo:
        self._maybe_fail("acquire")
        return super().acquire(timeout)

    def yield_(self) -> None:
        self._maybe_fail("yield")
        super().yield_()


def test_calls_lost_to_an_agent_restart_are_made_again() -> None:
    log: list[str] = []
    run(RestartingBaton(log), 1, Phases(1.0, 2.0, 3.0), pause=lambda s: None, out=io.StringIO())
    assert log[:4] == ["acquire lost", "acquire", "yield lost", "yield"]
    assert log.count("acquire") == log.count("yield") == 2


def test_an_agent_away_longer_than_the_wait_ends_the_retries_with_its_reason() -> None:
    now = [0.0]
    attempts: list[float] = []

    def away() -> None:
        attempts.append(now[0])
        now[0] += 5.0  # each attempt waits out the client's connect timeout
        raise AgentUnavailable("not connected to the Baton agent: still reconnecting after 5 s")

    with pytest.raises(AgentUnavailable, match="still reconnecting"):
        across_agent_restarts(away, wait_s=30.0, clock=lambda: now[0], pause=lambda s: None)
    assert attempts == [0.0, 5.0, 10.0, 15.0, 20.0, 25.0]


def test_gpu_phases_hold_a_turn_and_scoring_does_not() -> None:
    log: list[str] = []
    out = io.StringIO()
    turns = run(
        RecordingBaton(log),
        2,
        Phases(generate_s=1.0, score_s=2.0, train_s=3.0),
        pause=lambda s: log.append(f"work {s:g}"),
        out=out,
    )
    one_step = ["acquire", "work 1", "yield", "work 2", "acquire", "work 3", "yield"]
    assert log == one_step * 2
    assert [(t.step, t.phase, t.tokens) for t in turns] == [
        (1, "generation", (1,)),
        (1, "training", (2,)),
        (2, "generation", (3,)),
        (2, "training", (4,)),
    ]
    assert "step 2 training" in out.getvalue() and "scoring" in out.getvalue()


@contextlib.contextmanager
def running_agent(backend: str) -> Iterator[tuple[str, str, Any]]:
    """A real agent on a unix socket, on its own event loop; yields (socket, fake dir, preparer)."""
    workdir = Path(tempfile.mkdtemp(dir="/tmp", prefix="grpo"))
    fake_dir = str(workdir / "gpus")
    # One simulated 100 MiB GPU: two 60 MiB tenants cannot both be resident.
    config = AgentConfig(
        socket=str(workdir / "agent.sock"),
        state_dir=str(workdir / "state"),
        http_port=0,
        parking=ParkingOptions(
            backend=backend, fake_gpus="1x100", fake_scale=1 / 64, fake_dir=fake_dir
        ),
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> Agent:
        agent = build_agent(config)
        await agent.start()
        return agent

    agent = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=10)
    preparer = agent.preparer
    try:
        yield config.socket, fake_dir, preparer
    finally:
        asyncio.run_coroutine_threadsafe(agent.stop(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        if not thread.is_alive():
            loop.close()
        shutil.rmtree(workdir, ignore_errors=True)


def run_tenants(socket: str, gpu: str, extra_env: dict[str, str], *args: str) -> str:
    """Two example tenants as processes; their combined output once both exit cleanly."""
    env = {**os.environ, names.ENV_AGENT_SOCKET: socket, names.ENV_GPUS: gpu, **extra_env}
    env["PYTHONPATH"] = str(ROOT)
    tenants = [
        subprocess.Popen(
            [sys.executable, "-m", "agent.examples.grpo_loop", *args, "--tenant", name],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("policy-a", "policy-b")
    ]
    outputs = [t.communicate(timeout=60) for t in tenants]
    for tenant, (_out, err) in zip(tenants, outputs, strict=True):
        assert tenant.returncode == 0, err
    return "".join(out for out, _ in outputs)


FAST = ("--steps", "3", "--generate-s", "0.01", "--score-s", "0", "--train-s", "0.01")


def test_two_tenant_processes_take_turns() -> None:
    with running_agent("none") as (socket, _, _):
        text = run_tenants(socket, GPU, {}, *FAST)
    tokens = [int(t) for t in re.findall(r"held [\d.]+ ms on GPU-[\w-]+ \(token (\d+)\)", text)]
    # Twelve turns on one GPU, each with its own fencing token: nobody shared a turn.
    assert len(tokens) == 12 and len(set(tokens)) == 12
    assert text.count("done: 6 turns") == 2


def test_simulated_memory_survives_parking() -> None:
    gpu = names.fake_gpu_uuid(0)
    with running_agent("fake") as (socket, fake_dir, preparer):
        env = {names.ENV_FAKE_GPU_DIR: fake_dir}
        text = run_tenants(socket, gpu, env, *FAST, "--gpu-memory-mib", "60")
        moved = [
            sample.value
            for metric in preparer.metrics.registry.collect()
            for sample in metric.samples
            if sample.name.endswith("moved_bytes_total")
        ]
    assert text.count("memory verified after 5 turns") == 2
    # 60 + 60 MiB do not fit one 100 MiB GPU: the tenants were parked and restored in turn.
    assert sum(moved) > 0

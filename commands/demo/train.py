"""Runs real training tenants as processes: alone (no agent, or on a GPU of their own) or sharing
one simulated GPU on an agent with the `app` backend, too small for any two of them at once, so
every switch parks one tenant through its own `TorchParker` and restores another.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from agent.examples.train.jobs import JobConfig, estimate_bytes
from baton.contract.names import MIB
from commands.demo.lines import read_line

TENANT = [sys.executable, "-m", "agent.examples.train.tenant"]
START_TIMEOUT_S = 120.0
"""How long a tenant may take to import torch, build its model and connect."""
FLAGS = {f.name: "--" + f.name.replace("_", "-") for f in fields(JobConfig)}
"""The tenant's command-line flag for each `JobConfig` field."""


class TrainRunError(Exception):
    """A tenant failed or never answered; the message says which and why."""


class Spec(Protocol):
    """A tenant to run: `TenantSpec` here, `commands.demo.trl.TrlSpec` for TRL jobs."""

    @property
    def name(self) -> str: ...
    @property
    def config(self) -> Any: ...
    def argv(self, solo: bool) -> list[str]: ...
    def footprint_mib(self) -> float: ...


@dataclass(frozen=True)
class TenantSpec:
    """One tenant: its name, what it trains, and for how many steps (0: until the deadline)."""

    name: str
    config: JobConfig
    steps: int = 0
    duty: int = 0

    def argv(self, solo: bool) -> list[str]:
        """The tenant process's command line."""
        flags = [f"{FLAGS[k]}={v}" for k, v in vars(self.config).items()]
        mode = ["--solo"] if solo else []
        extra = ["--duty", str(self.duty)] if self.duty else []
        return [*TENANT, "--name", self.name, "--steps", str(self.steps), *flags, *mode, *extra]

    def footprint_mib(self) -> float:
        """MiB a park of this tenant moves."""
        return estimate_bytes(self.config) / MIB


MIX = ("grpo", "sft")
"""Tenant i trains MIX[i % 2]."""


@dataclass(frozen=True)
class TrainMix:
    """K tenants, GRPO and SFT in turn; the defaults take 0.1-0.2 s device phases on a CPU core."""

    tenants: int = 3
    steps: int = 40
    device: str = "cpu"
    d_model: int = 64
    layers: int = 2
    digits: int = 6
    sft_batch: int = 256
    grpo_batch: int = 32
    group: int = 8
    grpo_off_s: float = 0.55
    """GRPO's modelled off-device wait per step (a remote verifier, a sandbox), beside scoring."""
    sft_off_s: float = 0.3
    """SFT's modelled off-device wait per step (fetching the next batch)."""

    def specs(self) -> list[TenantSpec]:
        """The K tenants, SFT and GRPO mixed, each with its own seed."""
        out = []
        for i in range(self.tenants):
            kind = MIX[i % len(MIX)]
            grpo = kind == "grpo"
            config = JobConfig(
                kind=kind, seed=100 + i, digits=self.digits, d_model=self.d_model,
                layers=self.layers, batch=self.grpo_batch if grpo else self.sft_batch,
                group=self.group, lr=3e-4 if grpo else 1e-3, device=self.device,
                off_s=self.grpo_off_s if grpo else self.sft_off_s,
            )  # fmt: skip
            out.append(TenantSpec(f"t{i + 1}-{kind}", config, steps=self.steps))
        return out


def shared_gpu_mib(specs: Sequence[Spec], fits: int = 1) -> int:
    """A GPU that holds any `fits` of the tenants but never `fits + 1`: switches must park."""
    sizes = sorted(s.footprint_mib() for s in specs)
    if not 1 <= fits < len(sizes) or len(sizes) < 2:
        raise TrainRunError(f"{fits} of {len(sizes)} tenants at once: nothing would be parked")
    gpu = math.ceil(sum(sizes[-fits:]))
    if sum(sizes[: fits + 1]) <= gpu:
        raise TrainRunError(
            f"{fits + 1} tenants of {', '.join(f'{x:.2f}' for x in sizes[: fits + 1])} MiB fit"
            f" together on a {gpu} MiB GPU, so fewer would be parked; make them larger"
            " (--d-model, --sft-batch, --grpo-batch) or more alike"
        )
    return gpu


@dataclass
class Outcome:
    """The tenants' "done" reports, and what the agent counted (shared runs)."""

    reports: list[dict[str, Any]]
    moves: dict[str, dict[str, float]] = field(default_factory=dict)
    gpu_mib: int = 0


async def run_shared(
    specs: Sequence[Spec], deadline: float = math.inf, *, fits: int = 1
) -> Outcome:
    """All tenants on one simulated GPU of an agent with the `app` backend, taking turns; the
    GPU holds `fits` of them at once (`shared_gpu_mib`)."""
    from commands.demo.fakenode import FakeNode, FakeNodeOptions

    gpu_mib = shared_gpu_mib(specs, fits)
    budget = math.ceil(sum(s.footprint_mib() for s in specs)) + 1
    node = FakeNode(
        FakeNodeOptions(backend="app", fake_gpus=f"1x{gpu_mib}", host_memory_budget_mib=budget)
    )
    await node.start()
    try:
        reports = await run_tenants(specs, node.tenant_env(0), deadline, Path(node.workdir))
        return Outcome(reports, agent_moves(node), gpu_mib)
    finally:
        await node.stop()


async def run_alone(specs: Sequence[Spec], *, agent: bool = True) -> list[dict[str, Any]]:
    """Each tenant by itself, one after another: through an agent on a GPU it has to itself,
    or (`agent=False`) with no agent at all."""
    if not agent:
        logdir = Path(tempfile.mkdtemp(prefix="baton-train-", dir="/tmp"))
        try:
            return await run_tenants(specs, None, math.inf, logdir, solo=True)
        finally:
            shutil.rmtree(logdir, ignore_errors=True)
    from commands.demo.fakenode import FakeNode, FakeNodeOptions

    reports = []
    for spec in specs:
        gpu = math.ceil(spec.footprint_mib()) + 1
        node = FakeNode(FakeNodeOptions(backend="app", fake_gpus=f"1x{gpu}"))
        await node.start()
        try:
            reports += await run_tenants([spec], node.tenant_env(0), math.inf, Path(node.workdir))
        finally:
            await node.stop()
    return reports


async def run_tenants(
    specs: Sequence[Spec],
    env: Mapping[str, str] | None,
    deadline: float,
    logdir: Path | None,
    *,
    solo: bool = False,
) -> list[dict[str, Any]]:
    """Start the tenants, let them all go at once, and return their "done" reports in order."""
    procs: list[asyncio.subprocess.Process] = []
    logs: list[Path | None] = []
    try:
        for spec in specs:
            log = logdir / f"{spec.name}.log" if logdir else None
            logs.append(log)
            stderr = log.open("wb") if log else asyncio.subprocess.DEVNULL
            try:
                procs.append(await _spawn(spec.argv(solo), env, stderr))
            finally:
                if log and not isinstance(stderr, int):
                    stderr.close()
        for spec, proc, log in zip(specs, procs, logs, strict=True):
            ready = await read_line(proc, START_TIMEOUT_S)
            if ready.get("event") != "ready":
                raise TrainRunError(f"tenant {spec.name} did not start: {_why(ready, log)}")
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(f"go {deadline!r}\n".encode())
        wait = (deadline - time.time() if deadline < math.inf else 0) + 600.0
        done = await asyncio.gather(*(read_line(p, wait) for p in procs))
        for spec, report, log in zip(specs, done, logs, strict=True):
            if report.get("event") != "done":
                raise TrainRunError(f"tenant {spec.name} failed: {_why(report, log)}")
        for proc in procs:  # all done: now they may leave
            assert proc.stdin is not None
            proc.stdin.write(b"exit\n")
        for proc in procs:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 30)
        return list(done)
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def _spawn(
    argv: list[str], env: Mapping[str, str] | None, stderr: Any
) -> asyncio.subprocess.Process:
    """A tenant process with pipes for its protocol."""
    import os

    return await asyncio.create_subprocess_exec(
        *argv,
        env=dict(env or os.environ),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=stderr,
    )


def _why(report: Mapping[str, Any], log: Path | None) -> str:
    """The tenant's error and the last lines of its stderr."""
    tail = log.read_text(errors="replace").strip().splitlines()[-5:] if log and log.exists() else []
    return str(report.get("error", report)) + "".join(f"\n  {line}" for line in tail)


def agent_moves(node: Any) -> dict[str, dict[str, float]]:
    """Parks and restores the agent counted for the app backend, from its metrics (`timed`:
    those it ran and timed, not the restores it left to a tenant's grant)."""
    registry = node.preparer.metrics.registry
    out = {}
    for direction in ("park", "restore"):
        labels = {"backend": "app", "direction": direction}
        out[direction] = {
            "count": registry.get_sample_value("baton_moves_total", labels) or 0.0,
            "timed": registry.get_sample_value("baton_move_seconds_count", labels) or 0.0,
            "bytes": registry.get_sample_value("baton_moved_bytes_total", labels) or 0.0,
            "seconds": registry.get_sample_value("baton_move_seconds_sum", labels) or 0.0,
        }
    return out


def same_training(alone: Mapping[str, Any], shared: Mapping[str, Any]) -> list[str]:
    """Where two runs of one tenant differ (per-step losses, rewards, final parameters)."""
    diffs = []
    for key in ("steps", "losses", "rewards", "params_sha256"):
        if alone[key] != shared[key]:
            diffs.append(f"{alone['name']}: {key} differ")
    return diffs

"""Runs the demo's two phases: each tenant alone on its own fake GPU, then all sharing one.

Each phase starts a fresh agent with the `fake` backend in this process
(`commands.demo.fakenode`) and K tenant processes that use the real client over the agent's unix
socket. Everything measured about the GPUs comes from the agent: its event stream (who held which
GPU when), its busy-seconds counter and its move metrics; the tenants report only their steps and
data checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agent.core import events as ev
from baton.contract.names import MIB, fake_gpu_uuid
from commands.demo.analysis import Hold, busy_seconds, cycle_duty, holds, on_gpu
from commands.demo.fakenode import WORK_ROOT, FakeNode, FakeNodeOptions
from commands.demo.lines import read_line

TENANT = [sys.executable, "-m", "commands.demo.tenant"]
START_TIMEOUT_S = 60.0
"""How long tenants may take to start and connect (imports are slow on a busy machine)."""
TRAINING_START_TIMEOUT_S = 120.0
"""The same for real training tenants, which import torch (and TRL) and build their models."""
TRAINING_KINDS = ("train", "trl")
Tick = Callable[[str, float, int], None]
"""Progress callback: phase label, seconds since its tenants started, turns granted so far."""


class DemoError(Exception):
    """The demo could not run (a tenant did not start); the message says which and why."""


@dataclass(frozen=True)
class DemoConfig:
    """The tenants, their phases and the simulated node."""

    tenants: int = 3
    duty: float = 0.4
    """Share of time each tenant alone keeps its GPU busy (its GPU phase over its cycle)."""
    cycle_s: float = 1.5
    """Mean seconds of one step: GPU phase plus off-GPU phase."""
    jitter: float = 0.1
    duration_s: float = 20.0
    """Seconds each of the two phases is measured."""
    warmup_s: float = 2.0
    """Seconds each phase runs before it is measured, so the figures show its steady state."""
    gpu_memory_mib: int = 16384
    footprints_mib: tuple[int, ...] = (6144,)
    """Device memory per tenant; the last value repeats for the remaining tenants."""
    pcie_gbps: float = 55.0
    scale: float = 1 / 4096
    """Real bytes per simulated byte of device memory."""
    seed: int = 7
    tenant_kind: str = "synthetic"
    """`synthetic` (sleeps and byte patterns, `fake` backend), `train` (real SFT and GRPO
    tenants, `commands.demo.train`, parked by their own `TorchParker` through the `app` backend) or
    `trl` (TRL's SFTTrainer and GRPOTrainer, `commands.demo.trl`, parked the same way)."""

    def footprint(self, i: int) -> int:
        """MiB of device memory tenant `i` uses."""
        return self.footprints_mib[min(i, len(self.footprints_mib) - 1)]

    def name(self, i: int) -> str:
        """Display name of tenant `i`."""
        return f"t{i + 1}"

    @property
    def backend(self) -> str:
        """The agent's parking backend for these tenants."""
        return "app" if self.tenant_kind in TRAINING_KINDS else "fake"

    @property
    def start_timeout_s(self) -> float:
        """How long the tenants may take to say they are ready."""
        return TRAINING_START_TIMEOUT_S if self.tenant_kind in TRAINING_KINDS else START_TIMEOUT_S

    def command(self, i: int) -> list[str]:
        """Tenant process `i`'s command line."""
        if self.tenant_kind in TRAINING_KINDS:
            return training_argv(self.tenant_kind, self.tenants, i, self.name(i))
        return [*TENANT, *self.tenant_args(i)]

    def tenant_args(self, i: int) -> list[str]:
        """Command-line flags of tenant process `i`."""
        return [
            "--name", self.name(i), "--footprint-mib", str(self.footprint(i)),
            "--gpu-s", repr(self.duty * self.cycle_s),
            "--off-s", repr((1 - self.duty) * self.cycle_s),
            "--jitter", repr(self.jitter), "--seed", str(self.seed * 1000 + i),
            "--duty", str(round(self.duty * 100)),
        ]  # fmt: skip


def training_argv(kind: str, tenants: int, i: int, name: str) -> list[str]:
    """Tenant `i` of `tenants` real training tenants (`train` or `trl`), training until the
    deadline the demo sends it."""
    if kind == "trl":
        from commands.demo.trl import TrlMix

        trl = TrlMix(tenants=tenants, steps=0).specs()[i]
        return replace(trl, name=name).argv(solo=False)
    from commands.demo.train import TrainMix

    spec = TrainMix(tenants=tenants, steps=0).specs()[i]
    return replace(spec, name=name).argv(solo=False)


@dataclass
class TenantResult:
    """One tenant's own report of a phase."""

    name: str
    gpu: str
    tenant_id: str = ""
    steps: int = 0
    verified: int = 0
    mismatches: list[str] = field(default_factory=list)
    turns: list[list[Any]] = field(default_factory=list)
    error: str = ""

    def steps_in(self, t0: float, t1: float) -> int:
        """Steps whose GPU phase ended within [t0, t1]."""
        return sum(1 for turn in self.turns if t0 <= turn[3] <= t1)


@dataclass
class PhaseResult:
    """One phase as the agent saw it, plus the tenants' reports."""

    label: str
    gpus: list[str]
    t0: float
    t1: float
    holds: list[Hold]
    tenants: list[TenantResult]
    agent_busy_s: dict[str, float]
    """The agent's busy-seconds counter per GPU at the end of the phase (whole phase)."""
    moves: dict[str, dict[str, float]]
    """Per direction ("park", "restore"): count, bytes (simulated) and seconds, from metrics."""
    events: list[ev.Event] = field(default_factory=list)
    """The agent's event stream during the phase."""

    @property
    def wall_s(self) -> float:
        """Length of the measured window."""
        return self.t1 - self.t0

    def requested(self) -> dict[str, float]:
        """When each turn was asked for (tenants' clocks, the same host clock): lease id → time."""
        return {turn[0]: turn[1] for t in self.tenants for turn in t.turns}

    def duty(self, gpu: str) -> float:
        """Busy ÷ wall of `gpu` over the window."""
        return busy_seconds(on_gpu(self.holds, gpu), self.t0, self.t1) / self.wall_s

    def cycle_duty(self, gpu: str) -> float:
        """Busy share of `gpu` over the whole cycles in the window (see `cycle_duty`)."""
        return cycle_duty(on_gpu(self.holds, gpu), self.t0, self.t1)


def check_room(config: DemoConfig) -> None:
    """`ValueError` naming --scale where the simulated GPUs' files would not fit in `WORK_ROOT`:
    every tenant's footprint at that scale, and the largest once more while a move copies it
    (a park writes the host copy whole before it drops the device one)."""
    if config.backend != "fake":
        return
    sizes = [config.footprint(i) for i in range(config.tenants)]
    need = math.ceil((sum(sizes) + max(sizes)) * config.scale)
    free = shutil.disk_usage(WORK_ROOT).free // MIB
    if need > free:
        raise ValueError(
            f"--scale {config.scale:g}: the simulated GPUs' memory takes up to {need} MiB under "
            f"{WORK_ROOT} (every tenant's footprint at that scale, and the largest once more as "
            f"it moves) and {WORK_ROOT} has {free} MiB free; give a smaller --scale"
        )


async def run_phase(config: DemoConfig, shared: bool, tick: Tick | None = None) -> PhaseResult:
    """Run the tenants alone on their own GPUs (`shared=False`) or all on one GPU."""
    k = config.tenants
    label = "shared" if shared else "alone"
    node = FakeNode(
        FakeNodeOptions(
            backend=config.backend,
            fake_gpus=f"{1 if shared else k}x{config.gpu_memory_mib}",
            fake_scale=config.scale,
            pcie_gbps=config.pcie_gbps,
            host_memory_budget_mib=sum(config.footprint(i) for i in range(k)),
        )
    )
    await node.start()
    try:
        service = node.agent.service
        async with service.events.subscribe() as queue:
            log: list[ev.Event] = []
            collector = asyncio.create_task(_collect(queue, log))
            try:
                tenants, t0, t1 = await _drive(node, config, shared, label, log, tick)
            finally:
                collector.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await collector
            while not queue.empty():
                log.append(queue.get_nowait())
        now = time.time()
        gpus = [fake_gpu_uuid(i) for i in range(1 if shared else k)]
        busy = {g: service.metrics.busy_seconds(service.table, g, now) for g in gpus}
        return PhaseResult(
            label, gpus, t0, t1, holds(log, now), tenants, busy, _moves(node), events=log
        )
    finally:
        await node.stop()


async def _collect(queue: asyncio.Queue[ev.Event], log: list[ev.Event]) -> None:
    while True:
        log.append(await queue.get())


async def _drive(
    node: FakeNode,
    config: DemoConfig,
    shared: bool,
    label: str,
    log: list[ev.Event],
    tick: Tick | None,
) -> tuple[list[TenantResult], float, float]:
    """Start the tenants, let them run for the phase, and gather their reports."""
    k = config.tenants
    results = [TenantResult(config.name(i), fake_gpu_uuid(0 if shared else i)) for i in range(k)]
    logs = [Path(node.workdir) / f"{r.name}.log" for r in results]
    procs: list[asyncio.subprocess.Process] = []
    try:
        for i, log_path in enumerate(logs):
            procs.append(await _spawn(node, config, i, shared, log_path))
        for proc, result, log_path in zip(procs, results, logs, strict=True):
            ready = await read_line(proc, config.start_timeout_s)
            if ready.get("event") != "ready":
                raise DemoError(
                    f"tenant {result.name} did not start: {ready.get('error', ready)}"
                    f"{_tail(log_path)}"
                )
            result.tenant_id = ready["tenant_id"]
        start = time.time()
        t0 = start + config.warmup_s
        t1 = t0 + config.duration_s
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(f"go {t1!r}\n".encode())
        limit = t1 - start + config.start_timeout_s
        reports = [asyncio.create_task(read_line(p, limit)) for p in procs]
        pending: set[asyncio.Task[dict[str, Any]]] = set(reports)
        while pending:
            _, pending = await asyncio.wait(pending, timeout=0.2)
            if tick is not None:
                grants = sum(1 for e in log if e.kind == ev.GRANTED)
                tick(label, min(time.time(), t1) - start, grants)
        for task, result, log_path in zip(reports, results, logs, strict=True):
            _absorb(result, task.result())
            if result.error:
                result.error += _tail(log_path)
        for proc in procs:  # every tenant is done; a tenant that waits for it may leave now
            assert proc.stdin is not None
            proc.stdin.close()
        for proc in procs:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 10)
        return results, t0, t1
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def _spawn(
    node: FakeNode, config: DemoConfig, i: int, shared: bool, log_path: Path
) -> asyncio.subprocess.Process:
    """Tenant `i`'s process, its stderr going to `log_path`."""
    with log_path.open("wb") as stderr:  # the child keeps its own descriptor
        return await asyncio.create_subprocess_exec(
            *config.command(i),
            env=node.tenant_env(0 if shared else i),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
        )


def _tail(path: Path, lines: int = 5) -> str:
    """The last lines a tenant wrote to its stderr, to explain its failure."""
    text = path.read_text(errors="replace").strip().splitlines()[-lines:] if path.exists() else []
    return "".join(f"\n  {line}" for line in text)


def _absorb(result: TenantResult, report: dict[str, Any]) -> None:
    if report.get("event") != "done":
        result.error = str(report.get("error", report))
        return
    result.steps = int(report["steps"])
    result.verified = int(report["verified"])
    result.mismatches = list(report["mismatches"])
    result.turns = list(report["turns"])


def _moves(node: FakeNode) -> dict[str, dict[str, float]]:
    """Parks and restores counted by the agent's metrics."""
    assert node.preparer is not None
    registry = node.preparer.metrics.registry
    out = {}
    for direction in ("park", "restore"):
        labels = {"backend": node.options.backend, "direction": direction}

        def value(name: str, labels: dict[str, str] = labels) -> float:
            return registry.get_sample_value(name, labels) or 0.0

        out[direction] = {
            "count": value("baton_moves_total"),
            "bytes": value("baton_moved_bytes_total"),
            "seconds": value("baton_move_seconds_sum"),
        }
    return out


async def run_comparison(
    config: DemoConfig, tick: Tick | None = None
) -> tuple[PhaseResult, PhaseResult]:
    """The baseline (alone) phase, then the shared phase."""
    alone = await run_phase(config, shared=False, tick=tick)
    shared = await run_phase(config, shared=True, tick=tick)
    return alone, shared

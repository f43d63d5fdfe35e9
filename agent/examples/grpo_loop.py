"""A GRPO-shaped tenant: generate on the GPU, score off it, train on it, and print every turn.

Run in a pod that the device plugin allocated (BATON_AGENT_SOCKET and BATON_GPUS are set):

    python -m agent.examples.grpo_loop --steps 20 --generate-s 0.4 --score-s 0.6 --train-s 0.3

The GPU phases hold a turn; scoring (reward models, verifiers, sandboxes) runs on the CPU while
another tenant's turn uses the GPU. Phase durations model the work, so the loop runs anywhere.
On simulated GPUs (the agent's `fake` backend, `BATON_FAKE_GPU_DIR`), `--gpu-memory-mib N`
allocates device memory there and checks at every turn that the pattern written on the previous
turn survived whatever parking happened in between.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TextIO

from agent.client import Baton, LeaseInfo
from agent.client.restarts import across_agent_restarts
from baton.contract.names import MIB

CGROUP_MEMORY_MAX = "/sys/fs/cgroup/memory.max"


class TurnTaker(Protocol):
    """The part of `agent.client.Baton` the loop uses."""

    def acquire(self, timeout: float | None = None) -> LeaseInfo: ...

    def yield_(self) -> None: ...


@dataclass(frozen=True)
class Phases:
    """Modelled seconds per phase of one GRPO step."""

    generate_s: float = 0.4
    score_s: float = 0.6
    train_s: float = 0.3


@dataclass(frozen=True)
class Turn:
    """One GPU phase as the tenant saw it."""

    step: int
    phase: str
    waited_s: float
    held_s: float
    gpus: tuple[str, ...]
    tokens: tuple[int, ...]

    def line(self, tenant: str) -> str:
        gpus = ",".join(self.gpus)
        tokens = ",".join(str(t) for t in self.tokens)
        return (
            f"{tenant} step {self.step} {self.phase}: waited {self.waited_s * 1000:.1f} ms,"
            f" held {self.held_s * 1000:.1f} ms on {gpus} (token {tokens})"
        )


class SimulatedMemory:
    """Device memory on the fake backend's simulated GPUs: verify the last pattern, write anew."""

    def __init__(self, tenant_id: str, gpus: Sequence[str], mib: int) -> None:
        from agent.parking.fakegpu import FakeGpuMemory

        self.memory = FakeGpuMemory(tenant_id)
        self.gpus = list(gpus)
        self.seed = 0
        for gpu in self.gpus:
            self.memory.allocate(gpu, mib, memory_limit_mib())

    def __call__(self) -> None:
        for gpu in self.gpus:
            if self.seed:
                self.memory.verify_pattern(gpu, self.seed)
            self.memory.write_pattern(gpu, self.seed + 1)
        self.seed += 1


def memory_limit_mib(path: str = CGROUP_MEMORY_MAX) -> int | None:
    """This container's memory cgroup limit in MiB (cgroup v2), None when unlimited or unknown."""
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return None if text == "max" else int(text) // MIB


def gpu_phase(
    baton: TurnTaker,
    step: int,
    phase: str,
    work: Callable[[], None],
    clock: Callable[[], float],
    acquire_timeout: float | None,
    touch: Callable[[], None] | None = None,
) -> Turn:
    """Hold one turn for the phase's GPU work and describe it."""
    asked = clock()
    lease = across_agent_restarts(lambda: baton.acquire(acquire_timeout))
    granted = clock()
    try:
        if touch is not None:
            touch()
        work()
    finally:
        across_agent_restarts(baton.yield_)
    tokens = tuple(lease.fencing_tokens.get(gpu, 0) for gpu in lease.gpus)
    return Turn(step, phase, granted - asked, clock() - granted, tuple(lease.gpus), tokens)


def run(
    baton: TurnTaker,
    steps: int,
    phases: Phases,
    *,
    tenant: str = "tenant",
    pause: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    out: TextIO = sys.stdout,
    acquire_timeout: float | None = None,
    touch: Callable[[], None] | None = None,
) -> list[Turn]:
    """Run `steps` GRPO steps; returns the turns taken, two per step.

    `touch` runs at the start of every turn (e.g. `SimulatedMemory`'s pattern check).
    """
    turns: list[Turn] = []
    for step in range(1, steps + 1):
        generate = gpu_phase(
            baton,
            step,
            "generation",
            lambda: pause(phases.generate_s),
            clock,
            acquire_timeout,
            touch,
        )
        print(generate.line(tenant), file=out, flush=True)
        pause(phases.score_s)
        print(
            f"{tenant} step {step} scoring: {phases.score_s * 1000:.0f} ms off the GPU",
            file=out,
            flush=True,
        )
        train = gpu_phase(
            baton, step, "training", lambda: pause(phases.train_s), clock, acquire_timeout, touch
        )
        print(train.line(tenant), file=out, flush=True)
        turns += [generate, train]
    return turns


def _env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=int(os.environ.get("GRPO_STEPS", 20)))
    parser.add_argument("--generate-s", type=float, default=_env_float("GRPO_GENERATE_S", 0.4))
    parser.add_argument("--score-s", type=float, default=_env_float("GRPO_SCORE_S", 0.6))
    parser.add_argument("--train-s", type=float, default=_env_float("GRPO_TRAIN_S", 0.3))
    parser.add_argument("--acquire-timeout", type=float, default=None)
    parser.add_argument(
        "--gpu-memory-mib", type=int, default=int(os.environ.get("GRPO_GPU_MEMORY_MIB", 0))
    )
    parser.add_argument("--tenant", default=os.environ.get("HOSTNAME") or socket.gethostname())
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: `python -m agent.examples.grpo_loop`."""
    args = parse_args(argv)
    phases = Phases(args.generate_s, args.score_s, args.train_s)
    with Baton(name=args.tenant, gpu_memory_mib=args.gpu_memory_mib) as baton:
        touch = None
        if args.gpu_memory_mib > 0:
            assert baton.tenant is not None
            touch = SimulatedMemory(baton.tenant.tenant_id, baton.tenant.gpus, args.gpu_memory_mib)
        turns = run(
            baton,
            args.steps,
            phases,
            tenant=args.tenant,
            acquire_timeout=args.acquire_timeout,
            touch=touch,
        )
        if touch is not None:
            print(f"{args.tenant} memory verified after {touch.seed - 1} turns", flush=True)
    waited = sorted(t.waited_s for t in turns) or [0.0]
    median_ms = waited[len(waited) // 2] * 1000
    print(f"{args.tenant} done: {len(turns)} turns, median wait {median_ms:.1f} ms", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

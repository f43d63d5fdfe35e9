"""A synthetic RL tenant process: a GPU phase holding a turn, then an off-GPU phase, in a loop.

During each turn it verifies the pattern it wrote into its fake device memory the turn before
(the memory may have been parked and restored in between), then writes a new one. Off the GPU it
models reward scoring and environment steps. It speaks JSON lines on stdout: "ready" once
connected, then, after a `go <deadline>` line on stdin, one "done" (or "error") object.

    python -m commands.demo.tenant --name t1 --footprint-mib 6144 --gpu-s 0.6 --off-s 1.4
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.client import Baton, LeaseInfo
from agent.parking.fakegpu import FakeGpuMemory, PatternMismatch
from baton.contract.names import ENV_GPUS


class TurnTaker(Protocol):
    """The part of `agent.client.Baton` a tenant uses."""

    def acquire(self, timeout: float | None = None) -> LeaseInfo: ...

    def yield_(self) -> None: ...


class DeviceMemory(Protocol):
    """The part of `agent.parking.fakegpu.FakeGpuMemory` a tenant uses."""

    def allocate(self, gpu: str, mib: int, memory_limit_mib: int | None = None) -> None: ...

    def write_pattern(self, gpu: str, seed: int) -> None: ...

    def verify_pattern(self, gpu: str, seed: int) -> None: ...


@dataclass(frozen=True)
class Shape:
    """Mean seconds of each phase, how much they vary (fraction) and the seed of the variation."""

    gpu_s: float
    off_s: float
    jitter: float = 0.1
    seed: int = 0


@dataclass
class Record:
    """What one tenant did: its turns as [lease_id, requested, granted, yielded], and checks."""

    steps: int = 0
    verified: int = 0
    mismatches: list[str] = field(default_factory=list)
    turns: list[list[Any]] = field(default_factory=list)


def pattern_seed(name: str, step: int) -> int:
    """The pattern a tenant writes in `step` (distinct per tenant and step)."""
    return zlib.crc32(name.encode()) * 100_000 + step


def run_loop(
    baton: TurnTaker,
    memory: DeviceMemory,
    gpu: str,
    name: str,
    footprint_mib: int,
    shape: Shape,
    deadline: float,
    *,
    clock: Callable[[], float] = time.time,
    pause: Callable[[float], None] = time.sleep,
    acquire_timeout: float = 60.0,
) -> Record:
    """Take GPU and off-GPU phases until `deadline` (on `clock`); no turn starts after it."""
    rng = random.Random(shape.seed)
    record = Record()
    while clock() < deadline:
        hold = shape.gpu_s * rng.uniform(1 - shape.jitter, 1 + shape.jitter)
        off = shape.off_s * rng.uniform(1 - shape.jitter, 1 + shape.jitter)
        requested = clock()
        lease = baton.acquire(acquire_timeout)
        granted = clock()
        try:
            if record.steps == 0:
                memory.allocate(gpu, footprint_mib)
            else:
                try:
                    memory.verify_pattern(gpu, pattern_seed(name, record.steps - 1))
                    record.verified += 1
                except PatternMismatch as e:
                    record.mismatches.append(str(e))
            memory.write_pattern(gpu, pattern_seed(name, record.steps))
            pause(max(0.0, granted + hold - clock()))
        finally:
            baton.yield_()
        record.turns.append([lease.lease_id, requested, granted, clock()])
        record.steps += 1
        if clock() >= deadline:
            break
        pause(min(off, deadline - clock()))
    return record


def say(**fields: Any) -> None:
    """One JSON line on stdout."""
    print(json.dumps(fields), flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="A synthetic RL tenant of `baton demo`.")
    p.add_argument("--name", required=True)
    p.add_argument("--footprint-mib", type=int, required=True)
    p.add_argument("--gpu-s", type=float, required=True)
    p.add_argument("--off-s", type=float, required=True)
    p.add_argument("--jitter", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--duty", type=int, default=0, help="gpu-duty to declare, percent")
    p.add_argument("--acquire-timeout", type=float, default=60.0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point of one tenant process."""
    args = parse_args(argv)
    gpu = os.environ[ENV_GPUS].split(",")[0]
    shape = Shape(args.gpu_s, args.off_s, args.jitter, args.seed)
    baton = Baton(name=args.name, gpu_memory_mib=args.footprint_mib, gpu_duty=args.duty)
    try:
        baton.connect()
        assert baton.tenant is not None
        tenant_id = baton.tenant.tenant_id
        memory = FakeGpuMemory(tenant_id, timeout=args.acquire_timeout)
        say(event="ready", tenant_id=tenant_id, pid=os.getpid())
        command = sys.stdin.readline().split()
        if command[:1] != ["go"]:
            say(event="error", error=f"expected 'go <deadline>', got {command!r}")
            return 1
        record = run_loop(
            baton, memory, gpu, args.name, args.footprint_mib, shape, float(command[1]),
            acquire_timeout=args.acquire_timeout,
        )  # fmt: skip
        say(event="done", tenant_id=tenant_id, **record.__dict__)
        return 0
    except Exception as e:
        say(event="error", error=f"{type(e).__name__}: {e}")
        return 1
    finally:
        baton.close()


if __name__ == "__main__":
    sys.exit(main())

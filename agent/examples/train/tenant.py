"""A real training tenant process: SFT or GRPO, each device phase inside a Baton turn.

    python -m agent.examples.train.tenant --kind grpo --name t1 --steps 20

Parks go through `agent.client.torch.TorchParker` (the agent's `app` backend calls it over
the session). `--solo` trains without an agent. It speaks JSON lines on stdout: "ready" once
connected, then, after a `go <deadline>` line on stdin (`go inf`: no deadline), one "done"
object with every step's figures, its turns, its moves and its final parameters' SHA-256; it
exits at the next line (or end) of stdin. `--go` starts at once and exits when done.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from baton.contract.names import MIB


@dataclass
class Report:
    """What one tenant did: per-step figures, turns as [lease, requested, granted, yielded]."""

    steps: int = 0
    verified: int = 0
    mismatches: list[str] = field(default_factory=list)
    turns: list[list[Any]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    step_ends: list[float] = field(default_factory=list)
    params_sha256: str = ""
    footprint_bytes: int = 0
    moves: dict[str, float] = field(default_factory=dict)
    callbacks: list[list[Any]] = field(default_factory=list)
    """The park/restore callbacks the agent asked for: action, read, started, finished,
    answered (wall-clock seconds), bytes (`Baton.callback_timings`)."""
    started: float = 0.0
    ended: float = 0.0


class Turns:
    """`turn(phase)` for a job: acquire, check the parameters survived, work, sync, yield."""

    def __init__(self, job: Any, baton: Any, parker: Any, acquire_timeout: float) -> None:
        self.job, self.baton, self.parker = job, baton, parker
        self.acquire_timeout = acquire_timeout
        self.report = Report()
        self._last: float | None = None
        self._ok = True

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        from agent.examples.train.jobs import sync

        requested = time.time()
        lease_id = f"solo-{len(self.report.turns)}"
        if self.baton is not None:
            lease_id = self.baton.acquire(self.acquire_timeout).lease_id
        granted = time.time()
        try:
            with self.parker.in_use():
                now = self.job.fingerprint()
                if self._last is not None and now != self._last:
                    self._ok = False
                    self.report.mismatches.append(f"{phase}: parameters changed between turns")
                yield
                self._last = self.job.fingerprint()
                sync(self.job.device)
        finally:
            if self.baton is not None:
                self.baton.yield_()
        self.report.turns.append([lease_id, requested, granted, time.time()])

    def final(self) -> tuple[str, int]:
        """The parameters' SHA-256 and the bytes a park moves, read on one more (unrecorded)
        turn: between turns the agent may have parked them."""
        if self.baton is not None:
            self.baton.acquire(self.acquire_timeout)
        try:
            with self.parker.in_use():
                return self.job.digest(), self.parker.footprint_bytes()
        finally:
            if self.baton is not None:
                self.baton.yield_()

    def step_done(self, figures: dict[str, float]) -> None:
        """Count a finished step."""
        r = self.report
        if r.steps > 0 and self._ok:
            r.verified += 1
        self._ok = True
        r.steps += 1
        r.step_ends.append(time.time())
        r.losses.append(figures["loss"])
        if "reward" in figures:
            r.rewards.append(figures["reward"])


def say(**fields: Any) -> None:
    """One JSON line on stdout."""
    print(json.dumps(fields), flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from agent.examples.train.jobs import KINDS, JobConfig

    d = JobConfig()
    p = argparse.ArgumentParser(description="A real SFT or GRPO tenant taking Baton turns.")
    p.add_argument("--kind", choices=KINDS, default="grpo")
    p.add_argument("--name", default=os.environ.get("HOSTNAME", "trainer"))
    p.add_argument("--steps", type=int, default=0, help="stop after this many (0: deadline)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--digits", type=int, default=d.digits)
    p.add_argument("--d-model", type=int, default=d.d_model)
    p.add_argument("--layers", type=int, default=d.layers)
    p.add_argument("--heads", type=int, default=d.heads)
    p.add_argument("--batch", type=int, default=d.batch)
    p.add_argument("--group", type=int, default=d.group)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--beta", type=float, default=d.beta)
    p.add_argument("--clip", type=float, default=d.clip)
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--off-s", type=float, default=d.off_s)
    p.add_argument("--device", default=d.device)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--duty", type=int, default=0, help="gpu-duty to declare, percent")
    p.add_argument("--solo", action="store_true", help="train without an agent")
    p.add_argument("--go", action="store_true", help="start without waiting for 'go'")
    p.add_argument("--acquire-timeout", type=float, default=120.0)
    p.add_argument("--footprint-mib", type=int, default=0, help="ignored; the demo passes it")
    return p.parse_args(argv)


def config_of(args: argparse.Namespace) -> Any:
    """The job's settings from the flags."""
    from agent.examples.train.jobs import JobConfig

    return JobConfig(
        kind=args.kind, seed=args.seed, digits=args.digits, d_model=args.d_model,
        layers=args.layers, heads=args.heads, batch=args.batch, group=args.group, lr=args.lr,
        beta=args.beta, clip=args.clip, epochs=args.epochs, off_s=args.off_s, device=args.device,
    )  # fmt: skip


def train(turns: Turns, steps: int, deadline: float) -> Report:
    """Take steps until `steps` are done (if set) or `deadline` passes."""
    report = turns.report
    report.started = time.time()
    while time.time() < deadline and (steps == 0 or report.steps < steps):
        turns.step_done(turns.job.step(turns))
    report.ended = time.time()
    return report


def main(argv: list[str] | None = None) -> int:
    """Entry point of one tenant process."""
    args = parse_args(argv)
    from agent.client import Baton
    from agent.client.torch import TorchParker
    from agent.examples.train.jobs import deterministic, estimate_bytes, make_job

    config = config_of(args)
    deterministic(args.threads, config.device)
    job = make_job(config)
    parker = TorchParker(*job.sources(), device=job.device)
    baton = None
    if not args.solo:
        mib = math.ceil(estimate_bytes(config) / MIB)
        baton = Baton(
            name=args.name, gpu_memory_mib=mib, gpu_duty=args.duty,
            on_park=parker.park, on_restore=parker.restore,
        )  # fmt: skip
    try:
        tenant_id = args.name
        if baton is not None:
            baton.connect()
            assert baton.tenant is not None
            tenant_id = baton.tenant.tenant_id
        say(event="ready", tenant_id=tenant_id, pid=os.getpid())
        command = ["go", "inf"] if args.go else sys.stdin.readline().split()
        if command[:1] != ["go"] or len(command) != 2:
            say(event="error", error=f"expected 'go <deadline>', got {command!r}")
            return 1
        turns = Turns(job, baton, parker, args.acquire_timeout)
        report = train(turns, args.steps, float(command[1]))
        report.params_sha256, report.footprint_bytes = turns.final()
        report.moves = asdict(parker.stats)
        report.callbacks = [list(t) for t in getattr(baton, "callback_timings", [])]
        say(event="done", tenant_id=tenant_id, name=args.name, kind=args.kind, **asdict(report))
        if not args.go:  # stay connected until every tenant of the run is done
            sys.stdin.readline()
        return 0
    except Exception as e:
        say(event="error", error=f"{type(e).__name__}: {e}")
        return 1
    finally:
        if baton is not None:
            baton.close()


if __name__ == "__main__":
    sys.exit(main())

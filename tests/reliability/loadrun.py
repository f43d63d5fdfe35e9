"""The agent load run: tenant processes over fake GPUs, judged by the invariant checker."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from agent.core.waitbound import WaitBound
from tests.harness.agent import ROOT
from tests.harness.lines import JsonLines

from .checker import Report
from .node import LoadNode

GPU_MIB = 100


class LineProc:
    """A child process speaking JSON lines on stdout; every read is bounded."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.name = " ".join(argv[2:5])
        self.stderr = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed by kill()
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
            cwd=ROOT,
        )
        self._lines = JsonLines(self.proc, self.name, self.said)

    def line(self, timeout: float) -> dict[str, Any]:
        """The next JSON line; fails after `timeout` or if the process exited."""
        line = self._lines.next(timeout)
        assert line.get("event") != "error", f"{self.name}: {line}{self.said()}"
        return line

    def said(self) -> str:
        """The end of the process's stderr, for a failure message."""
        self.stderr.seek(0)
        return "; stderr: " + self.stderr.read()[-3000:]

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self.stderr.close()


@dataclass
class LoadResult:
    """The checker's report plus what the tenants saw."""

    report: Report
    tenant_errors: list[str]
    verified: int
    max_wait_allowed: float

    def figures(self, tenants: int, gpus: int, seconds: float) -> dict[str, Any]:
        return {
            **self.report.figures(),
            "tenant_processes": tenants,
            "gpus": gpus,
            "seconds": seconds,
            "verified_turns": self.verified,
            "data_errors": len(self.tenant_errors),
            "max_wait_allowed_s": round(self.max_wait_allowed, 2),
        }


def run_agent_load(
    tenants: int, gpus: int, seconds: float, *, policy: str = "lrs", max_hold: float = 1.0
) -> LoadResult:
    """`tenants` processes over `gpus` fake GPUs of 100 MiB (footprints 35-45 MiB, so two
    fit and the rest park) for `seconds`, under `policy`."""
    rng = random.Random(7)
    node = LoadNode(f"{gpus}x{GPU_MIB}", queue_policy=policy, max_hold=max_hold).start()
    procs: list[LineProc] = []
    try:
        for i in range(tenants):
            gpu = node.gpu_ids[i % gpus]
            argv = [
                sys.executable, "-m", "tests.reliability.load_tenant", "--name", f"t{i}",
                "--mib", str(rng.randint(35, 45)), "--seed", str(i),
            ]  # fmt: skip
            procs.append(LineProc(argv, node.tenant_env(gpu)))
        for p in procs:
            assert p.line(60).get("ready")
        end = time.time() + seconds
        for p in procs:
            p.send(f"go {end}")
        summaries = [p.line(seconds + 60) for p in procs]
    finally:
        for p in procs:
            p.kill()
        node.stop()
    bound = WaitBound(max_hold)
    allowed = bound.longest_wait(bound.turns_ahead(sharing=-(-tenants // gpus) - 1))
    errors = [f"t{i}: {e}" for i, s in enumerate(summaries) for e in s["errors"]]
    verified = sum(int(s["verified"]) for s in summaries)
    return LoadResult(node.checker.check(bound=bound), errors, verified, allowed)

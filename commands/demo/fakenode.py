"""A node with simulated GPUs on one machine: an agent with the `fake` backend on a temp socket.

`FakeNode` runs the agent in this process; `AgentProcess` runs `baton agent` as a child (to kill
it with SIGKILL and start it again). Tenants are separate processes given `tenant_env()`; they
use the real client, and `agent.parking.fakegpu.FakeGpuMemory` for their device memory.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.parking.preparer import ParkingPreparer
from agent.parking.setup import ParkingOptions
from baton.contract.names import ENV_AGENT_SOCKET, ENV_FAKE_GPU_DIR, ENV_GPUS, fake_gpu_uuid

WORK_ROOT = "/tmp"
"""Where a fake node makes its directory: its sockets, state and simulated GPU memory."""


@dataclass
class FakeNodeOptions:
    """The agent's settings for a fake node."""

    backend: str = "fake"
    """`fake`, or `app` (tenants park themselves; the fake GPUs give the GPU inventory)."""
    fake_gpus: str = "1x100"
    fake_scale: float = 1 / 64
    pcie_gbps: float = 0.0
    host_memory_budget_mib: int = 0
    headroom_mib: int = 0
    max_hold: float = 60.0
    reconnect_grace: float = 10.0
    policy: str = "fifo"
    extra_args: list[str] = field(default_factory=list)


class FakeNode:
    """An in-process agent (fake backend by default) under a fresh directory in `WORK_ROOT`."""

    def __init__(self, options: FakeNodeOptions | None = None, workdir: str | None = None) -> None:
        self.options = options or FakeNodeOptions()
        self.workdir = workdir or tempfile.mkdtemp(prefix="baton-node-", dir=WORK_ROOT)
        self._own_workdir = workdir is None
        self.socket = f"{self.workdir}/agent.sock"
        self.fake_dir = f"{self.workdir}/gpus"
        self.agent: Any = None
        self.preparer: ParkingPreparer | None = None

    def tenant_env(self, gpu_index: int = 0) -> dict[str, str]:
        """Environment for a tenant process on simulated GPU `gpu_index`."""
        return tenant_env(self.socket, self.fake_dir, gpu_index)

    async def start(self) -> None:
        """Start the agent; returns once its sockets accept connections."""
        from agent.assembly import AgentConfig, build_agent

        o = self.options
        config = AgentConfig(
            socket=self.socket,
            state_dir=f"{self.workdir}/state",
            http_host="127.0.0.1",
            http_port=0,
            queue_policy=o.policy,
            max_hold=o.max_hold,
            reconnect_grace=o.reconnect_grace,
            parking=ParkingOptions(
                backend=o.backend,
                fake_gpus=o.fake_gpus,
                fake_scale=o.fake_scale,
                fake_dir=self.fake_dir,
                pcie_gbps=o.pcie_gbps,
                host_memory_budget_mib=o.host_memory_budget_mib,
                headroom_mib=o.headroom_mib,
                simulated_inventory=True,
            ),
        )
        self.agent = build_agent(config)
        self.preparer = self.agent.parking
        assert self.preparer is not None
        await self.agent.start()

    async def stop(self) -> None:
        """Stop the agent and remove the directory (tenant memory included)."""
        if self.agent is not None:
            await self.agent.stop()
        if self.preparer is not None:
            self.preparer.backend.close()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def tenant_env(socket: str, fake_dir: str, gpu_index: int = 0) -> dict[str, str]:
    """The environment a tenant process needs to find the agent and its fake GPU."""
    return {
        **os.environ,
        ENV_AGENT_SOCKET: socket,
        ENV_GPUS: fake_gpu_uuid(gpu_index),
        ENV_FAKE_GPU_DIR: fake_dir,
    }


class AgentProcess:
    """`baton agent --backend fake` as a child process, sharing a work directory across restarts."""

    READY = re.compile(r"agent ready: socket \S+, http :(\d+)")

    def __init__(self, workdir: str, options: FakeNodeOptions | None = None) -> None:
        self.workdir = workdir
        self.options = options or FakeNodeOptions()
        self.socket = f"{workdir}/agent.sock"
        self.fake_dir = f"{workdir}/gpus"
        self.http_port = 0
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []
        self._cond = threading.Condition()

    def argv(self) -> list[str]:
        """The command line of `baton agent` for this node."""
        o = self.options
        baton = shutil.which("baton", path=str(Path(sys.executable).parent)) or "baton"
        return [
            baton, "agent", "--backend", o.backend, "--socket", self.socket,
            "--state-dir", f"{self.workdir}/state", "--http-host", "127.0.0.1",
            "--http-port", "0", "--fake-dir", self.fake_dir, "--fake-gpus", o.fake_gpus,
            "--fake-scale", repr(o.fake_scale), "--pcie-gbps", repr(o.pcie_gbps),
            "--host-memory-budget", str(o.host_memory_budget_mib),
            "--headroom", str(o.headroom_mib), "--max-hold", repr(o.max_hold),
            "--reconnect-grace", repr(o.reconnect_grace), "--queue-policy", o.policy,
            *o.extra_args,
        ]  # fmt: skip

    def start(self, timeout: float = 30.0) -> None:
        """Start the agent and wait for its "agent ready" log line; an agent that does not get
        ready in time is stopped before the TimeoutError is raised."""
        lines: list[str] = []  # this process's own: a killed one's reader may still be draining
        self.lines = lines
        self.proc = subprocess.Popen(
            self.argv(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
        )
        threading.Thread(target=self._read, args=(self.proc, lines), daemon=True).start()
        try:
            line = self.wait_for(self.READY.pattern, timeout)
        except BaseException:
            self.stop()
            raise
        match = self.READY.search(line)
        assert match is not None
        self.http_port = int(match[1])

    def _read(self, proc: subprocess.Popen[str], lines: list[str]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            with self._cond:
                lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            lines.append("<exited>")
            self._cond.notify_all()

    def wait_for(self, pattern: str, timeout: float, start: int = 0) -> str:
        """The first log line from index `start` on matching `pattern`; TimeoutError if none."""
        regex = re.compile(pattern)

        def found() -> str | None:
            hit = next((ln for ln in self.lines[start:] if regex.search(ln)), None)
            return hit or ("<exited>" if "<exited>" in self.lines[start:] else None)

        with self._cond:
            line = self._cond.wait_for(found, timeout)
        if line is None or line == "<exited>":
            tail = "\n".join(self.lines[-20:])
            raise TimeoutError(f"agent log never showed {pattern!r}; last lines:\n{tail}")
        return line

    def kill(self) -> None:
        """SIGKILL the agent (nothing is cleaned up) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM the agent and wait for it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

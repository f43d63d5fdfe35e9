"""Test harness for the node agent: a real agent on a temp socket, and real tenant processes.

    with AgentRunner(tmp) as agent:                      # agent in a background thread
        a = TenantProcess(agent.socket, "a", ["GPU-0"])  # a subprocess using agent.client.Baton
        a.request("acquire")                              # -> {"ok": True, "lease_id": ..., ...}
        agent.wait_event(lambda e: e.kind == "granted")  # the agent's own event stream

Events, HTTP and the service's state are read through the runner; nothing sleeps to wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from agent.assembly import Agent, AgentConfig, build_agent
from agent.core.events import Event
from agent.core.residency import TurnPreparer
from agent.parking.backends.base import Backend
from agent.parking.setup import ParkingOptions
from agent.server.service import LeaseService
from commands.localnode.procs import wait_for
from tests.harness.lines import JsonLines

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]


_MADE: list[str] = []
"""The directories `short_tmpdir` made in this process, for `remove_short_tmpdirs`."""


def short_tmpdir() -> str:
    """A directory under /tmp short enough for unix socket paths, removed at the end of the
    test session at the latest (`remove_short_tmpdirs`)."""
    path = tempfile.mkdtemp(dir="/tmp", prefix="baton-")
    _MADE.append(path)
    return path


def remove_short_tmpdirs() -> None:
    """Remove every directory `short_tmpdir` made (tests/conftest.py, as the session ends)."""
    while _MADE:
        shutil.rmtree(_MADE.pop(), ignore_errors=True)


def one_small_fake_gpu(workdir: str, **options: Any) -> ParkingOptions:
    """Parking on one simulated GPU of 100 MiB (its memory files under `workdir`, 1/64 of the
    bytes), no headroom: two tenants of 60 MiB cannot both be resident."""
    return ParkingOptions(
        backend="fake",
        fake_gpus="1x100",
        fake_dir=f"{workdir}/gpus",
        fake_scale=1 / 64,
        headroom_mib=0,
        **options,
    )


class AgentRunner:
    """A node agent on its own event loop in a background thread."""

    def __init__(
        self,
        workdir: str | None = None,
        *,
        preparer: TurnPreparer | None = None,
        backend: tuple[Backend, Mapping[str, int]] | None = None,
        **config: Any,
    ) -> None:
        self.workdir = workdir or short_tmpdir()
        self.config = AgentConfig(
            socket=f"{self.workdir}/agent.sock",
            state_dir=f"{self.workdir}/state",
            http_host="127.0.0.1",
            http_port=0,
            **config,
        )
        self.preparer = preparer
        """Replaces the residency layer `config.parking` names (`build_agent`'s test seam)."""
        self.backend = backend
        """Replaces the backend `config.parking` names (`build_agent`'s test seam)."""
        self.seen: list[Event] = []
        """Every event the agent published since it started (as far as taken so far)."""
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._agent: Agent | None = None

    @property
    def socket(self) -> str:
        return self.config.socket

    @property
    def agent(self) -> Agent:
        """The agent `build_agent` made (once started)."""
        assert self._agent is not None
        return self._agent

    @property
    def service(self) -> LeaseService:
        return self.agent.service

    def start(self) -> AgentRunner:
        """Build the agent on its own loop, subscribe to its events, and wait until it serves."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.call(self._start())
        return self

    async def _start(self) -> None:
        self._agent = build_agent(self.config, preparer=self.preparer, backend=self.backend)
        self._events = self._agent.service.events.attach()  # before start: no event is missed
        await self._agent.start()

    @property
    def llmd_port(self) -> int:
        """The port of the llm-d listener (`llmd_listen=...:0`)."""
        assert self._agent is not None and self._agent.llmd is not None
        return self._agent.llmd.port

    def stop(self) -> None:
        """Stop the agent (its state directory stays) and its thread."""
        if self._loop is None or self._agent is None:
            return
        self.call(self._agent.stop())
        for task in asyncio.all_tasks(self._loop):
            self._loop.call_soon_threadsafe(task.cancel)
        self._loop.call_soon_threadsafe(self._loop.stop)
        assert self._thread is not None
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()  # its selector and self-pipe: three descriptors per runner
        self._loop = None

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        """Run a coroutine on the agent's loop and return its result."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def inspect(self, fn: Callable[[LeaseService], T]) -> T:
        """Evaluate `fn(service)` on the agent's loop (a consistent view of its state)."""

        async def run() -> T:
            return fn(self.service)

        return self.call(run())

    def moves(self, direction: str, backend: str = "fake") -> float:
        """How many parks or restores (`direction`) `backend` made (`baton_moves_total`)."""
        labels = {"backend": backend, "direction": direction}
        return self.service.metrics.registry.get_sample_value("baton_moves_total", labels) or 0.0

    def wait_queued_on(self, lock: asyncio.Lock, what: str, timeout: float = 10) -> None:
        """Return once a task of the agent waits for `lock` (held by the test); `what` names it
        in the failure."""

        def queued() -> bool | None:
            return self.inspect(lambda s: bool(lock._waiters)) or None

        wait_for(what, queued, timeout, every=0.01)

    def mark(self) -> int:
        """A position in the event history, for `wait_event(..., since=mark)`."""
        self._take(0)
        return len(self.seen)

    def _take(self, timeout: float) -> bool:
        """Move published events into `seen` (waiting up to `timeout` for one); any new?"""

        async def take() -> list[Event]:
            events = []
            if self._events.empty() and timeout > 0:
                with contextlib.suppress(TimeoutError):
                    events.append(await asyncio.wait_for(self._events.get(), timeout))
            while not self._events.empty():
                events.append(self._events.get_nowait())
            return events

        events = self.call(take(), timeout + 10)
        self.seen.extend(events)
        return bool(events)

    def wait_event(
        self, match: Callable[[Event], bool], timeout: float = 10, since: int = 0
    ) -> Event:
        """The first event from position `since` on that matches; fails after `timeout`."""
        deadline = time.monotonic() + timeout
        self._take(0)
        index = since
        while True:
            for event in self.seen[index:]:
                if match(event):
                    return event
            index = len(self.seen)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._take(remaining):
                kinds = [f"{e.kind}:{e.tenant_id}" for e in self.seen[since:]]
                raise AssertionError(f"no matching event within {timeout} s; saw {kinds}")

    @property
    def http_url(self) -> str:
        """The agent's HTTP address."""
        assert self._agent is not None
        return f"http://127.0.0.1:{self._agent.http_port}"

    def http(self, path: str) -> tuple[int, str]:
        """GET a path from the agent's HTTP server."""
        return http_get(f"{self.http_url}{path}")

    def status(self) -> dict[str, Any]:
        """The /v1/status document."""
        code, body = self.http("/v1/status")
        assert code == 200, body
        return dict(json.loads(body))

    def __enter__(self) -> AgentRunner:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class TenantProcess:
    """A tenant process driven line by line (see `tests/harness/agent_tenant.py`)."""

    def __init__(
        self,
        socket: str,
        name: str,
        gpus: Sequence[str],
        *,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), **(extra_env or {})}
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.harness.agent_tenant", socket, name, ",".join(gpus)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        self._lines = JsonLines(self.proc, f"tenant {name}")
        hello = self.reply(timeout=30)
        assert hello.get("ready"), hello
        self.pid = int(hello["pid"])

    def send(self, op: str, **args: Any) -> None:
        """Send a command without waiting for its answer."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()

    def reply(self, timeout: float = 10) -> dict[str, Any]:
        """The next answer from the tenant."""
        return self._lines.next(timeout)

    def request(self, op: str, wait: float = 10, **args: Any) -> dict[str, Any]:
        """Send a command and wait (up to `wait` seconds) for its answer."""
        self.send(op, **args)
        return self.reply(wait)

    def kill(self) -> None:
        """SIGKILL: no goodbye to the agent."""
        self.proc.kill()
        self.proc.wait(10)

    def close(self) -> None:
        """Ask the tenant to exit, or kill it."""
        if self.proc.poll() is None:
            try:
                self.send("exit")
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()


def http_get(url: str, timeout: float = 10) -> tuple[int, str]:
    """GET a daemon's HTTP document: its status and body, an error status included."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()

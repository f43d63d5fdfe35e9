"""Tenant processes for the fake-node tests, driven over their stdin/stdout line protocol."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import tempfile
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from commands.demo.fakenode import FakeNode, FakeNodeOptions

TENANT = [sys.executable, "-m", "tests.agent.parking.tenant_proc"]
APP_TENANT = [sys.executable, "-m", "tests.agent.parking.app_tenant"]


T = TypeVar("T")
RUN_TIMEOUT_S = 80


def run(coro: Awaitable[T]) -> T:
    """Run one test's coroutine, bounded."""
    return asyncio.run(asyncio.wait_for(coro, RUN_TIMEOUT_S))


class TenantProc:
    """One tenant process; `event()` returns its next JSON line."""

    def __init__(self, proc: asyncio.subprocess.Process, name: str, stderr: Path) -> None:
        self.proc = proc
        self.name = name
        self.stderr = stderr
        self.events: list[dict] = []

    @classmethod
    async def start(
        cls, env: dict[str, str], name: str, mib: int, *flags: str, argv: list[str] = TENANT
    ) -> TenantProc:
        fd, stderr = tempfile.mkstemp(prefix=f"baton-tenant-{name}-", suffix=".log")
        declare = ["--declare"] if argv is TENANT else []
        proc = await asyncio.create_subprocess_exec(
            *argv, "--name", name, "--mib", str(mib), *declare, *flags,
            env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=fd,
        )  # fmt: skip
        os.close(fd)
        return cls(proc, name, Path(stderr))

    def describe(self) -> str:
        """Its events and the end of its stderr, for a failure message."""
        return f"{self.name}: events {self.events}; stderr: {self.stderr.read_text()[-1500:]}"

    async def event(self, timeout: float = 30.0) -> dict:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not line:
            raise EOFError(f"tenant {self.name} exited ({self.events[-3:]})")
        event = json.loads(line)
        self.events.append(event)
        return event

    async def until(self, kind: str, timeout: float = 30.0) -> dict:
        """Events up to the first of `kind` (or an error, which fails)."""
        while True:
            event = await self.event(timeout)
            if event["event"] == kind:
                return event
            assert event["event"] != "error", self.describe()

    def tell(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")

    async def exit_code(self, timeout: float = 30.0) -> int:
        return await asyncio.wait_for(self.proc.wait(), timeout)

    async def reap(self) -> None:
        """Kill it if it still runs, and wait for it."""
        if self.proc.returncode is None:
            self.proc.kill()
            await asyncio.wait_for(self.proc.wait(), 10)
        self.stderr.unlink(missing_ok=True)


class LogWatch(logging.Handler):
    """Sets an event when a log message matches; install on a logger for the test's duration."""

    def __init__(self, needle: str) -> None:
        super().__init__()
        self.needle = needle
        self.seen = threading.Event()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if self.needle in message:
            self.messages.append(message)
            self.seen.set()


async def with_node(
    options: FakeNodeOptions, body: Callable[[FakeNode, list[TenantProc]], Awaitable[Any]]
) -> None:
    """Run `body` on a started fake node; the tenants it lists are reaped, the node stopped."""
    node = FakeNode(options)
    await node.start()
    tenants: list[TenantProc] = []
    try:
        await body(node, tenants)
    finally:
        for t in tenants:
            await t.reap()
        await node.stop()

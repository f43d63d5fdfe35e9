"""Daemons and tenant containers of the end-to-end node as real processes, with bounded waits."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from commands.localnode.procs import LocalNodeError, wait_for

ROOT = Path(__file__).resolve().parents[2]
BATON = [sys.executable, "-c", "from commands.cli import main; main()"]
T = TypeVar("T")


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def poll(what: str, probe: Callable[[], T | None], timeout: float, every: float = 0.05) -> T:
    """`probe()` until it returns a value; TimeoutError naming `what` after `timeout` seconds."""
    try:
        return wait_for(what, probe, timeout, every)
    except LocalNodeError as err:
        raise TimeoutError(str(err)) from None


def get_json(url: str, timeout: float = 5.0) -> Any:
    """GET a JSON document."""
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return json.load(reply)


def get_text(url: str, timeout: float = 5.0) -> str:
    """GET a text document."""
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return str(reply.read().decode())


def get_ok(url: str) -> bool | None:
    """True when `url` answers 200, None otherwise (for `poll`)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return True if reply.status == 200 else None
    except (urllib.error.URLError, OSError):
        return None


class Daemon:
    """`baton <command>` as a subprocess; its stderr is kept and searchable while it runs."""

    def __init__(self, name: str, args: Sequence[str], env: Mapping[str, str]) -> None:
        self.name = name
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(
            [*BATON, *args],
            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, name=f"{name}-log", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_for_line(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        """The first log line matching `pattern`; fails with the log if the daemon exits first."""
        regex = re.compile(pattern)

        def found() -> re.Match[str] | None:
            return next((m for m in map(regex.search, self.lines) if m), None)

        with self._cond:
            self._cond.wait_for(lambda: found() or self.proc.poll() is not None, timeout)
            match = found()
        if match is None:
            state = "exited" if self.proc.poll() is not None else "still running"
            raise AssertionError(f"{self.name} ({state}) never logged {pattern!r}:\n{self.log()}")
        return match

    def log(self) -> str:
        with self._cond:
            return "".join(self.lines[-60:])

    def stop(self) -> int:
        """SIGTERM, then SIGKILL if it lingers; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._reader.join(timeout=5)
        return int(self.proc.returncode)


def container_command(
    argv: Sequence[str], mounts: Sequence[tuple[str, str, bool]], root_is_user: bool
) -> list[str]:
    """Run `argv` in a private mount namespace with `(host, container, read_only)` bind mounts.

    It starts once a line arrives on its stdin (see `Kubelet.release`). The parent of each
    container path is covered by a fresh tmpfs first, so nothing of this machine's own tree
    shows through or is touched (as with a container's root file system).
    """
    steps = []
    covered: set[str] = set()
    for host, target, read_only in mounts:
        parent = str(Path(target).parent)
        if parent not in covered:
            covered.add(parent)
            steps.append(f"mount -t tmpfs tenant {shlex.quote(parent)}")
        steps.append(f"mkdir -p {shlex.quote(target)}")
        steps.append(f"mount --bind {shlex.quote(host)} {shlex.quote(target)}")
        if read_only:
            steps.append(f"mount -o remount,bind,ro {shlex.quote(target)}")
    steps.append("read -r start")  # the runtime says go once the process is in its cgroup
    steps.append("exec " + shlex.join(argv))
    unshare = ["unshare", "--mount"] if root_is_user else ["unshare", "--mount", "--map-root-user"]
    return [*unshare, "sh", "-ec", " && ".join(steps)]

"""Child processes of the local node: started in their own process group, logged, always ended."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
_LIVE: list[Process] = []
_LOCK = threading.Lock()


class LocalNodeError(RuntimeError):
    """The local node could not be started or did not behave."""


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, every: float = 0.1) -> T:
    """`probe()` until it returns a value; LocalNodeError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    idle = threading.Event()
    while True:
        found = probe()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise LocalNodeError(f"{what} did not happen within {timeout:g} s")
        idle.wait(every)


class Process:
    """One daemon: its command, its log file, and a stop that never leaves it running."""

    def __init__(
        self, name: str, argv: Sequence[str], log: Path, env: dict[str, str] | None = None
    ):
        self.name = name
        self.argv = list(argv)
        self.log = log
        self.env = env
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Process:
        """Start it in a new session, stdout and stderr appended to its log."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **(self.env or {})},
            )
        with _LOCK:
            _LIVE.append(self)
        return self

    @property
    def pid(self) -> int:
        """Its PID (it must have been started)."""
        assert self._proc is not None, f"{self.name} was never started"
        return self._proc.pid

    def running(self) -> bool:
        """Whether it has not exited."""
        return self._proc is not None and self._proc.poll() is None

    def check(self) -> None:
        """LocalNodeError with its log's tail if it has exited."""
        if self._proc is not None and self._proc.poll() is not None:
            raise LocalNodeError(
                f"{self.name} exited with {self._proc.returncode}; last lines of {self.log}:\n"
                + self.tail()
            )

    def tail(self, lines: int = 20) -> str:
        """The last lines of its log."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM to its process group, SIGKILL after `grace` seconds; reaped either way."""
        proc, self._proc = self._proc, None
        with _LOCK:
            if self in _LIVE:
                _LIVE.remove(self)
        if proc is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # anything it left in its group
        proc.wait()


def run(argv: Sequence[str], timeout: float = 60.0, check: bool = True, **kw: object) -> str:
    """Run a command to completion; its stdout, or LocalNodeError with its output."""
    done = subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **kw,  # type: ignore[call-overload]
    )
    if check and done.returncode != 0:
        raise LocalNodeError(
            f"{' '.join(argv)} failed ({done.returncode}): {(done.stderr or done.stdout).strip()}"
        )
    return str(done.stdout)


def stop_all() -> None:
    """Stop every process still running, newest first (an atexit and signal fallback)."""
    while True:
        with _LOCK:
            if not _LIVE:
                return
            proc = _LIVE[-1]
        proc.stop(grace=5.0)


atexit.register(stop_all)

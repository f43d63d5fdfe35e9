"""A child process's stdout as JSON objects, read by a thread so that every wait is bounded."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
from collections.abc import Callable
from typing import Any


class JsonLines:
    """The next JSON line of `proc`, or an AssertionError naming `name` (and `said()`)."""

    def __init__(
        self, proc: subprocess.Popen[str], name: str, said: Callable[[], str] = lambda: ""
    ) -> None:
        self._proc = proc
        self._name = name
        self._said = said
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.put(line)
        self._lines.put("")

    def next(self, timeout: float) -> dict[str, Any]:
        """The next line; fails after `timeout` seconds or once the process has exited."""
        try:
            text = self._lines.get(timeout=timeout)
        except queue.Empty:
            silent = f"{self._name} said nothing for {timeout} s"
            raise AssertionError(silent + self._said()) from None
        if not text:
            raise AssertionError(f"{self._name} exited with {self._proc.wait(5)}{self._said()}")
        return dict(json.loads(text))

"""A bench or the demo stopped midway: by Ctrl-C (SIGINT to its whole process group, as a
terminal sends it) or by SIGTERM (`kill`, `timeout`). It stops at once, leaves no tenant process
and no work directory behind, and says in one line that it was interrupted, without a traceback.
A /tmp it cannot write to is named in one line."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from baton.contract.names import ENV_AGENT_SOCKET
from commands.cli import app

BATON = [sys.executable, "-c", "from commands.cli import main; main()"]
HANDOFF = ["bench", "handoff", "--iterations", "3000", "--hold-ms", "5", "--rounds", "1"]
"""Its uncontended acquires take about a second; its turns, 30 s and more: stopped in them."""
SIG_DFL, SIG_IGN = signal.SIG_DFL, signal.SIG_IGN
DEMO = ["demo", "--duration", "60", "--warmup", "0", "--tenants", "2"]


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _socket(pid: int) -> str:
    """The agent socket a tenant process talks to: its --socket, or its environment's."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        env = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
    except OSError:
        return ""
    if "--socket" in argv:
        return argv[argv.index("--socket") + 1]
    return next((e.partition("=")[2] for e in env if e.startswith(f"{ENV_AGENT_SOCKET}=")), "")


def _running(proc: subprocess.Popen[str], tenants: int) -> tuple[list[int], Path]:
    """Once `tenants` tenant processes take turns: their ids, and the run's work directory."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = {pid: _socket(pid) for pid in _children(proc.pid)}
        found = {pid: socket for pid, socket in found.items() if socket}
        if len(found) >= tenants:
            return list(found), Path(next(iter(found.values()))).parent
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    pytest.fail(f"the run never started {tenants} tenants")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("command", "tenants", "sig", "says", "sigint"),
    [
        (HANDOFF, 2, signal.SIGINT, "baton bench handoff: interrupted by Ctrl-C (SIGINT)", SIG_DFL),
        (HANDOFF, 2, signal.SIGTERM, "baton bench handoff: interrupted by SIGTERM", SIG_DFL),
        # started in the background of a script (`baton bench handoff ... &`): SIGINT ignored
        (HANDOFF, 2, signal.SIGTERM, "baton bench handoff: interrupted by SIGTERM", SIG_IGN),
        (DEMO, 2, signal.SIGINT, "baton demo: interrupted by Ctrl-C (SIGINT)", SIG_DFL),
    ],
    ids=["handoff-ctrl-c", "handoff-sigterm", "handoff-sigterm-in-background", "demo-ctrl-c"],
)
def test_a_run_stopped_midway_stops_what_it_started_and_says_so(
    command: list[str],
    tenants: int,
    sig: signal.Signals,
    says: str,
    sigint: signal.Handlers,
    tmp_path: Path,
) -> None:
    proc = subprocess.Popen(
        [*BATON, *command, "--out-dir", str(tmp_path)] if command is DEMO else [*BATON, *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        preexec_fn=lambda: signal.signal(signal.SIGINT, sigint),
    )
    workdir = None
    try:
        pids, workdir = _running(proc, tenants)
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # Ctrl-C reaches the tenants too
        else:
            proc.send_signal(sig)
        _, err = proc.communicate(timeout=15)
        assert proc.returncode == 130, err
        assert err.strip().splitlines()[-1] == says
        assert "Traceback" not in err and "bad read" not in err  # its tenants simply went
        assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()]
        assert not workdir.exists()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


def test_a_tmp_it_cannot_write_to_is_named_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def read_only(suffix: str = "", prefix: str = "tmp", dir: str = "/tmp") -> str:
        path = f"{dir}/{prefix}x1y2z3"
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    result = CliRunner().invoke(app, ["bench", "handoff", "--iterations", "1"])
    assert result.exit_code == 1, result.output
    assert result.output == (
        "baton bench handoff: /tmp/baton-bench-x1y2z3: Read-only file system; it keeps its "
        "sockets and work files under /tmp\n"
    )

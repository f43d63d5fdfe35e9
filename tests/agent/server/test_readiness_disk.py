"""An agent whose journal the disk refuses (full, read-only) says so in `/readyz`: turns go on,
but a restart now would not know of them, which an operator should hear of before it happens.

The journal's open file is pointed at /dev/full underneath the running agent (`dup2`), as a
filled disk would refuse it, and pointed back at the journal to free the room again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agent.client import Baton
from agent.node import state
from agent.node.state import JOURNAL_FILE, STATE_FILE
from tests.e2e.processes import poll
from tests.harness.agent import AgentRunner

pytestmark = pytest.mark.timeout(60)

GPU = "GPU-0"


def journal_fd(journal: Path) -> int:
    """The descriptor this process (the in-process agent) writes `journal` through."""
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == str(journal):
                return int(name)
        except OSError:  # (a descriptor closed meanwhile)
            continue
    raise AssertionError(f"the agent has no open descriptor on {journal}")


def point(fd: int, path: str) -> None:
    """Make `fd` write to `path` from now on (appending)."""
    other = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.dup2(other, fd)
    finally:
        os.close(other)


def _granted(journal: Path) -> list[str]:
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    return [line["grant"]["lease_id"] for line in lines if "grant" in line]


def test_a_journal_the_disk_refuses_makes_the_agent_not_ready_until_it_is_written_again(
    agent: AgentRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state, "RETRY_S", 0.0)  # the next entry tries again at once
    journal = Path(agent.workdir) / "state" / JOURNAL_FILE
    snapshot_tmp = journal.parent / f".{STATE_FILE}.tmp"
    with Baton(agent.socket, [GPU], name="a") as baton:
        baton.acquire()  # the journal is opened by the first grant's line
        baton.yield_()
        fd = journal_fd(journal)
        point(fd, "/dev/full")
        snapshot_tmp.mkdir()  # the state file cannot be written either (as on a full disk)
        refused = baton.acquire()  # the turn goes on: its line is refused
        code, body = agent.http("/readyz")
        assert code == 503, body
        assert body == (
            f"not ready: cannot append to {journal} (No space left on device): turns go on, but "
            "an agent restarted now would not know of the turns granted and the memory parked "
            "since; free room in --state-dir\n"
        )
        assert refused.lease_id not in _granted(journal)
        snapshot_tmp.rmdir()
        point(fd, str(journal))  # room again: the next write takes the refused line with it
        baton.yield_()
    assert agent.http("/readyz") == (200, "ready\n")
    assert refused.lease_id in _granted(journal)


def test_a_state_file_covering_the_lines_the_journal_refused_makes_the_agent_ready_again(
    agent: AgentRunner,
) -> None:
    """The journal still refuses, but the state file (written at most a second after the
    change) holds what its lines said: a restart would know of it, and /readyz says ready."""
    journal = Path(agent.workdir) / "state" / JOURNAL_FILE
    with Baton(agent.socket, [GPU], name="a") as baton:
        baton.acquire()
        baton.yield_()
        point(journal_fd(journal), "/dev/full")  # for good: only the state file is written
        baton.acquire()
        poll("/readyz ready again", lambda: agent.http("/readyz") == (200, "ready\n") or None, 10)
        baton.yield_()

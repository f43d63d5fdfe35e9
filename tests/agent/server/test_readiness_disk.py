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
from agent.node.state import JOURNAL_FILE
from tests.harness.agent import AgentRunner

pytestmark = pytest.mark.timeout(60)

GPU = "GPU-0"


def _journal_fd(journal: Path) -> int:
    """The descriptor this process (the in-process agent) writes `journal` through."""
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == str(journal):
                return int(name)
        except OSError:  # (a descriptor closed meanwhile)
            continue
    raise AssertionError(f"the agent has no open descriptor on {journal}")


def _point(fd: int, path: str) -> None:
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
    agent: AgentRunner,
) -> None:
    journal = Path(agent.workdir) / "state" / JOURNAL_FILE
    with Baton(agent.socket, [GPU], name="a") as baton:
        baton.acquire()  # the journal is opened by the first grant's line
        baton.yield_()
        fd = _journal_fd(journal)
        _point(fd, "/dev/full")
        refused = baton.acquire()  # the turn goes on: its line is refused
        code, body = agent.http("/readyz")
        assert code == 503, body
        assert body == (
            f"not ready: cannot append to {journal} (No space left on device): turns go on, but "
            "an agent restarted now would not know of the turns granted and the memory parked "
            "since; free room in --state-dir\n"
        )
        assert refused.lease_id not in _granted(journal)
        _point(fd, str(journal))  # room again: the next write takes the refused line with it
        baton.yield_()
    assert agent.http("/readyz") == (200, "ready\n")
    assert refused.lease_id in _granted(journal)

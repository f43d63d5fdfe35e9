"""The agent's state store on a disk that fills: a write the disk cut short or refused leaves
no torn line and loses no entry, and the journal is cut back only whole.

Each test reads the state back with a fresh `StateStore`, as an agent restarted after a crash
does, so what was only in the old store's memory does not count.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from agent.core.leases import Lease
from agent.node.state import JOURNAL_FILE, PersistedState, StateStore
from agent.node.tenants import Tenant
from tests.agent.server.test_readiness_disk import journal_fd, point

A = Tenant(tenant_id="local/a", name="a", gpus=("GPU-0",))


def lease(lease_id: str, token: int) -> Lease:
    return Lease(lease_id, "local/a", ("GPU-0",), {"GPU-0": token}, 1.0, 31.0)


def restarted(path: Path):
    return StateStore(path).load()


PREAMBLE = """
import os, resource, signal, sys
from agent.core.leases import Lease
from agent.node import state
from agent.node.state import JOURNAL_FILE, StateStore

state.RETRY_S = 0.0  # (each entry tries the refused lines again; one test sets it back)

def lease(lease_id, token):
    return Lease(lease_id, "local/a", ("GPU-0",), {"GPU-0": token}, 1.0, 31.0)

store = StateStore(sys.argv[1])
store.load()
size = os.path.getsize(os.path.join(sys.argv[1], JOURNAL_FILE))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
"""
"""A process over the state directory in `sys.argv[1]`, ready to fill the disk: the scripts below
set `RLIMIT_FSIZE` (the journal's `size` now, the limit to restore `soft`)."""


def fill_the_disk(state_dir: Path, script: str) -> str:
    """Run `script` after `PREAMBLE` in a process of its own (a file size limit is the process's),
    with the journal `state_dir` holds now; its standard error."""
    run = subprocess.run(
        [sys.executable, "-c", PREAMBLE + textwrap.dedent(script), str(state_dir)],
        cwd=Path(__file__).resolve().parents[3],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    return run.stderr


def w1_granted(state_dir: Path) -> None:
    """A state directory whose journal holds the grant of w1 to tenant a."""
    store = StateStore(state_dir)
    store.save(PersistedState(tenants=[A]))
    store.record_grant(lease("w1", 1))
    store.close()


def test_a_write_the_full_disk_cut_short_leaves_no_torn_line_before_the_next(tmp_path):
    """A journal write that a full disk cut short part-way does not leave its start behind: the
    entries appended once there is room again follow whole lines, and a restart reads them."""
    w1_granted(tmp_path)
    stderr = fill_the_disk(
        tmp_path,
        """
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 20, hard))  # full 20 bytes into a line
        store.record_end("w1")
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # space freed again
        store.record_grant(lease("w2", 2))
        """,
    )
    assert "cannot append" in stderr
    loaded = restarted(tmp_path)  # the end of w1 is written again ahead of the grant of w2
    assert [x.lease_id for x in loaded.leases] == ["w2"] and loaded.tokens == {"GPU-0": 2}


def test_a_handoff_the_full_disk_refused_is_written_ahead_of_the_next_once_there_is_room(
    tmp_path,
):
    """The entries of a write the full disk refused go to the journal ahead of the next write
    that fits: a restart after it does not find the turn before still held beside the turn
    after (two holders of one GPU), nor wait for a snapshot to lose it."""
    w1_granted(tmp_path)
    stderr = fill_the_disk(
        tmp_path,
        """
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))  # the disk is full
        store.record_grant(lease("w2", 2), ended=["w1"])  # a handoff: one write, which fails
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # space freed again
        store.record_grant(lease("w3", 3), ended=["w2"])
        """,
    )
    assert "cannot append" in stderr
    loaded = restarted(tmp_path)
    assert [x.lease_id for x in loaded.leases] == ["w3"] and loaded.tokens == {"GPU-0": 3}


def test_a_journal_cut_back_on_a_full_disk_is_left_whole(tmp_path):
    """The snapshot's writer cutting the journal back, on a disk that fills part-way through the
    copy, keeps the journal it had rather than a torn copy that later entries follow."""
    store = StateStore(tmp_path)
    store.save(PersistedState(tenants=[A]))
    for n in (1, 2, 3):
        store.record_end(f"w{n - 1}")
        store.record_grant(lease(f"w{n}", n))
    store.close()
    stderr = fill_the_disk(
        tmp_path,
        """
        resource.setrlimit(resource.RLIMIT_FSIZE, (50, hard))  # the cut-back copy fills the disk
        try:
            store._compact(1, at_least=0)  # as the writer does after a snapshot up to entry 1
        except OSError as exc:
            print("compaction failed:", exc.strerror, file=sys.stderr)
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        store.record_grant(lease("w4", 4))
        """,
    )
    loaded = restarted(tmp_path)
    assert [x.lease_id for x in loaded.leases] == ["w3", "w4"] and loaded.tokens == {"GPU-0": 4}
    assert "compaction failed" in stderr


def test_a_journal_refused_a_moment_ago_is_tried_again_once_a_retry_s_not_by_every_entry(
    tmp_path,
):
    """Each try writes every line refused since: while the disk refuses them, entries try again
    at most once a `RETRY_S` (a full disk for an hour would otherwise make every grant write the
    hour's lines), and the first entry after that writes them all, in order."""
    w1_granted(tmp_path)
    before = (tmp_path / JOURNAL_FILE).stat().st_size
    stderr = fill_the_disk(
        tmp_path,
        """
        import types
        now = [100.0]
        state.time = types.SimpleNamespace(monotonic=lambda: now[0])
        state.RETRY_S = 1.0
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))  # the disk is full
        store.record_grant(lease("w2", 2), ended=["w1"])
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # space freed again
        store.record_grant(lease("w3", 3), ended=["w2"])  # not tried: refused a moment ago
        print("journal", os.path.getsize(os.path.join(sys.argv[1], JOURNAL_FILE)), file=sys.stderr)
        now[0] += 1.0
        store.record_grant(lease("w4", 4), ended=["w3"])
        """,
    )
    assert f"journal {before}\n" in stderr  # nothing written between the two tries
    loaded = restarted(tmp_path)
    assert [x.lease_id for x in loaded.leases] == ["w4"] and loaded.tokens == {"GPU-0": 4}


def test_an_entry_held_back_for_the_retry_is_unrecorded_and_tried_once_more_at_close(
    tmp_path: Path,
) -> None:
    """A state file covering the refused lines clears them, but an entry that comes within the
    retry's wait is held back unwritten: the store says so (`unrecorded`, the agent's /readyz)
    as for one refused, and its close tries the journal once more, whatever the wait."""
    store = StateStore(tmp_path)
    store.save(PersistedState(tenants=[A]))
    store.record_grant(lease("w1", 1))
    journal = tmp_path / JOURNAL_FILE
    fd = journal_fd(journal)
    point(fd, "/dev/full")
    store.record_grant(lease("w2", 2), ended=["w1"])  # refused
    assert store.unrecorded is not None
    store.save_soon(PersistedState(tenants=[A]))  # a state file holding w2's lines
    store.flush()
    assert store.unrecorded is None
    store.record_grant(lease("w3", 3), ended=["w2"])  # held back, or refused: unrecorded either way
    assert store.unrecorded is not None
    point(fd, str(journal))
    store.close()
    assert '"w3"' in journal.read_text()

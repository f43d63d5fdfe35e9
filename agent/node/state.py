"""The agent's durable state: tenants, leases, fencing tokens and parked processes, one JSON
snapshot with atomic writes, and a journal of what changed since it.

The journal is the record; the snapshot is its checkpoint. Every grant and every ended turn,
every revoked tenant queued first for the turn after (and such a queue place that ends
ungranted), every tenant registered, changed or gone, and every change to the parking backend's
record of parked processes is appended to the journal (one small `write`, on the event loop)
before anyone hears of it: a tenant that was told it holds the GPU keeps computing on it, so an
agent killed a moment later must come back with the lease (or the revoked tenant with its place
first in the queue), and memory parked a moment before must be found parked. The snapshot is
written off the event loop, a newer state replacing an unwritten one, at most once per
`agent.server.turn_state.SAVE_DELAY_S`; it says up to which journal entry it is complete, and
loading replays the entries after that. What only the snapshot holds is the
accounting, so a crash loses at most that delay of it. Once the journal passes
`JOURNAL_COMPACT_BYTES` the writer cuts it back to the entries the last written snapshot lacks.

Writes are not fsynced: they survive the agent's crash (SIGKILL, OOM kill), which is what
they are for; a node that loses power loses its GPU processes with them.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent.core.leases import Lease
from agent.node.state_json import (
    STATE_FORMAT,
    PersistedState,
    SavedResume,
    apply_entry,
    decode,
    encode,
    journal_line,
)
from agent.node.tenants import Tenant

__all__ = ["JOURNAL_FILE", "STATE_FILE", "PersistedState", "StateDirError", "StateStore"]

STATE_FILE = "agent-state.json"
JOURNAL_FILE = "agent-journal.jsonl"
JOURNAL_COMPACT_BYTES = 64 * 1024
"""The journal is cut back to what the last written snapshot lacks once it is this long."""
RETRY_S = 1.0
"""While the journal refuses writes (a full disk), entries try again at most this often: each
try writes every line refused since, which would otherwise cost every grant more and more."""
PROBE_BYTES = 64 * 1024
"""Written (then removed) at start: a state directory must hold a state file of this size."""
log = logging.getLogger(__name__)


class StateDirError(Exception):
    """The state directory cannot be used."""


class StateStore:
    """Reads and writes the state in `state_dir`."""

    def __init__(self, state_dir: str | Path) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / STATE_FILE
        self.journal_path = self.dir / JOURNAL_FILE
        self._cond = threading.Condition()
        self._latest: tuple[int, bytes] | None = None
        self._journal_lock = threading.Lock()
        self._seq = 0
        """The last journal entry's number."""
        self._entries: list[tuple[int, bytes]] = []
        """The journal's entries, as in the file."""
        self._journal_bytes = 0
        self._journal_fd: int | None = None
        self._journal_failed = False
        self.unrecorded: str | None = None
        """Why what changes now is not on disk (a journal write failed: a full disk, a
        read-only mount), till a write goes through again; None while it is."""
        self._unwritten: list[tuple[int, bytes]] = []
        """Lines a failed write left out of the journal (with their numbers): written ahead of
        the next entries, so that a restart never replays a later line without them (a grant
        without the end of the turn before it would restore two holders of one GPU), until they
        are, or a state file covering them is."""
        self._retry_at = 0.0
        self._refused = ""
        """Why the journal's last write failed (`unrecorded` while lines wait for a retry)."""
        """While the journal refuses writes: when the next entries may try again (`RETRY_S`)."""
        self._writing = False
        self._thread: threading.Thread | None = None
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.dir, prefix=".probe-") as probe:
                probe.write(b"\0" * PROBE_BYTES)  # creating an empty file works on a full disk
                probe.flush()
                os.fsync(probe.fileno())
        except OSError as exc:
            raise StateDirError(
                f"state directory {self.dir} is not writable ({exc.strerror}); "
                "pass --state-dir (BATON_AGENT_STATE_DIR) pointing at a writable directory"
            ) from exc

    def load(self) -> PersistedState:
        """The last saved state with the journal's later grants and ends applied, or an empty
        state; `StateDirError` (one line naming the file) for one this agent cannot read."""
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            data = {}
        except (OSError, ValueError) as exc:
            raise StateDirError(
                f"cannot read {self.path}: {exc}; move it aside to start afresh"
            ) from exc
        written = data.get("format", STATE_FORMAT) if isinstance(data, dict) else STATE_FORMAT
        if not isinstance(written, int) or written > STATE_FORMAT:
            raise StateDirError(
                f"{self.path} is in state format {written!r}, newer than this agent's "
                f"({STATE_FORMAT}): run the agent that wrote it, or move the file aside to start "
                "afresh (forgetting what it holds parked)"
            )
        try:
            state, covered = decode(data)
        except (AttributeError, KeyError, OverflowError, TypeError, ValueError) as exc:
            raise StateDirError(
                f"cannot read {self.path}: not a state this agent wrote "
                f"({type(exc).__name__}: {exc}); move it aside to start afresh"
            ) from None
        state.parked_from = str(self.path)
        self._seq = max(self._seq, covered)
        self._replay(state, covered)
        return state

    def _replay(self, state: PersistedState, covered: int) -> None:
        """Apply the journal's entries after `covered` to `state`."""
        try:
            raw = self.journal_path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StateDirError(
                f"cannot read {self.journal_path}: {exc.strerror}; move it aside to start afresh"
            ) from exc
        leases = {lease.lease_id: lease for lease in state.leases}
        tenants = {tenant.tenant_id: tenant for tenant in state.tenants}
        lines = raw.split(b"\n")
        torn = 0
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                seq = int(entry["seq"])
            except (ValueError, KeyError, OverflowError, TypeError) as exc:
                if number == len(lines):  # the torn end of a write the crash interrupted
                    torn = len(line)
                    break
                raise StateDirError(
                    f"cannot read {self.journal_path} line {number}: {exc}; "
                    "move it aside to start from the snapshot alone"
                ) from None
            self._seq = max(self._seq, seq)
            self._entries.append((seq, line + b"\n"))
            self._journal_bytes += len(line) + 1
            if seq <= covered:
                continue
            state.replayed += 1
            try:
                leases = apply_entry(entry, state, tenants, leases)
            except (AttributeError, KeyError, OverflowError, TypeError, ValueError) as exc:
                raise StateDirError(
                    f"cannot read {self.journal_path} line {number}: not an entry this agent "
                    f"wrote ({type(exc).__name__}: {exc}); move it aside to start from the "
                    "snapshot alone"
                ) from None
            if "parked" in entry:
                state.parked_from = f"{self.journal_path} line {number}"
        if raw and not raw.endswith(b"\n"):
            self._mend_end(len(raw), torn)
        state.tenants = list(tenants.values())
        state.leases = list(leases.values())

    def _mend_end(self, size: int, torn: int) -> None:
        """The journal (`size` bytes) does not end its last line, as a crash cut a write short:
        drop the `torn` bytes of a line that cannot be read, or end a whole one, so that the
        next entry starts a line of its own (after them, it could not be read, and the restart
        after would be refused)."""
        try:
            if torn:
                log.warning("%s: dropped a torn last line (%d bytes)", self.journal_path, torn)
                os.truncate(self.journal_path, size - torn)
            else:
                with open(self.journal_path, "ab") as f:
                    f.write(b"\n")
        except OSError as exc:
            raise StateDirError(
                f"cannot mend the last line of {self.journal_path}: {exc.strerror}"
            ) from exc

    def record_tenant(self, tenant: Tenant) -> None:
        """A tenant registered or changed: on disk before it can be granted a turn, so that a
        grant the journal holds always finds its tenant."""
        self._append([{"tenant": tenant.to_json()}])

    def record_gone(self, tenant_id: str) -> None:
        """A tenant left: a restart does not bring it back (nor any lease of its)."""
        self._append([{"gone": tenant_id}])

    def record_parked(self, parked: dict[str, Any]) -> None:
        """The parking backend's record after memory moved: a restart finds parked what is."""
        self._append([{"parked": parked}])

    def record_grant(
        self,
        lease: Lease,
        ended: Sequence[str] = (),
        parked: dict[str, Any] | None = None,
        resumes: Sequence[SavedResume] = (),
    ) -> None:
        """Make a grant durable before it is answered: one line appended to the journal, after
        the revoked tenants' `resumes`, the ends of the turns `ended` and the parking record
        `parked` (if memory moved for it) that made room for it, all in the same write."""
        entries = self._ends(ended, resumes)
        if parked is not None:
            entries.append({"parked": parked})
        self._append([*entries, {"grant": lease}])

    def record_end(self, *lease_ids: str, resumes: Sequence[SavedResume] = ()) -> None:
        """Turns ended (yielded, revoked, their tenants gone) or resumes that left the queue
        ungranted, after the `resumes` their revocations queued: one line each, in one write."""
        self._append(self._ends(lease_ids, resumes))

    @staticmethod
    def _ends(ended: Sequence[str], resumes: Sequence[SavedResume]) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = [{"resume": resume} for resume in resumes]
        return entries + [{"end": lease_id} for lease_id in ended]

    def _append(self, entries: list[dict[str, Any]]) -> None:
        with self._journal_lock:
            for entry in entries:
                self._seq += 1
                line = journal_line(entry, self._seq)
                self._entries.append((self._seq, line))
                self._journal_bytes += len(line)
                self._unwritten.append((self._seq, line))
            if self._journal_failed and time.monotonic() < self._retry_at:
                self.unrecorded = self._refused  # (a state file may have covered the ones before)
                return  # refused a moment ago: tried again at most once a `RETRY_S`
            self._write_unwritten()

    def _write_unwritten(self) -> None:
        """Write the lines not written yet, in order (under the journal's lock)."""
        try:
            if self._journal_fd is None:
                self._journal_fd = os.open(
                    self.journal_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644
                )
            data = b"".join(line for _, line in self._unwritten)
            written = os.write(self._journal_fd, data)
            if written < len(data):  # a full disk part-way: the line's start is undone
                self._cut_short_write(written)
        except OSError as exc:
            if not self._journal_failed:  # said once: the snapshot still follows
                log.error(
                    "cannot append to %s (%s): what changed now (a grant, a tenant, parked "
                    "memory) is lost if the agent crashes before the next snapshot",
                    self.journal_path,
                    exc.strerror,
                )
            self._journal_failed = True
            self._retry_at = time.monotonic() + RETRY_S
            self._refused = f"cannot append to {self.journal_path} ({exc.strerror})"
            self.unrecorded = self._refused
        else:
            if self._journal_failed:
                log.info("%s is written again", self.journal_path)
            self._journal_failed = False
            self._unwritten = []
            self.unrecorded = None

    def _covered(self, seq: int) -> None:
        """A state file holding the entries up to `seq` is on disk: the refused lines it covers
        need not be written (a restart skips a line it covers, written or not)."""
        with self._journal_lock:
            self._unwritten = [(n, line) for n, line in self._unwritten if n > seq]
            if not self._unwritten:
                self.unrecorded = None

    def _cut_short_write(self, written: int) -> None:
        """A write put only its first `written` bytes in the journal (the disk filled): take
        them out again, so that no line the next write follows is torn (a restart refuses a
        torn line before the last), then fail as a write that put nothing there."""
        assert self._journal_fd is not None
        size = os.fstat(self._journal_fd).st_size
        os.ftruncate(self._journal_fd, size - written)  # frees space: works on a full disk
        raise OSError(errno.ENOSPC, f"only {written} bytes of the entry were written")

    def _compact(self, covered: int, at_least: int | None = None) -> None:
        """The snapshot up to entry `covered` is on disk: if the journal is `at_least` long
        (`JOURNAL_COMPACT_BYTES`), keep only the entries after it."""
        limit = JOURNAL_COMPACT_BYTES if at_least is None else at_least
        if self._journal_bytes < limit:  # most snapshots: the journal is left alone
            return
        with self._journal_lock:
            rest = [(seq, line) for seq, line in self._entries if seq > covered]
            if len(rest) == len(self._entries):
                return
            self._entries = rest
            self._journal_bytes = sum(len(line) for _, line in rest)
            if not rest:  # one call, and atomic
                if self._journal_fd is not None:
                    os.ftruncate(self._journal_fd, 0)
                else:  # loaded, not appended to since: the file still holds what was loaded
                    with contextlib.suppress(FileNotFoundError):
                        os.truncate(self.journal_path, 0)
                self._unwritten, self.unrecorded = [], None  # the snapshot holds them
                return
            tmp = self.dir / f".{JOURNAL_FILE}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
            try:
                data = b"".join(line for _, line in rest)
                written = os.write(fd, data)
                if written < len(data):  # a full disk: the journal as it is stays
                    raise OSError(errno.ENOSPC, f"only {written} bytes of {tmp} were written")
                os.replace(tmp, self.journal_path)
            except OSError:
                os.close(fd)
                raise
            self._unwritten, self.unrecorded = [], None  # the new journal holds them
            if self._journal_fd is not None:
                os.close(self._journal_fd)
            self._journal_fd = fd

    def close(self) -> None:
        """Close the journal (after the last `flush`), the lines it refused tried once more."""
        with self._journal_lock:
            if self._unwritten:
                self._write_unwritten()
            if self._journal_fd is not None:
                os.close(self._journal_fd)
                self._journal_fd = None

    def save(self, state: PersistedState) -> None:
        """Write the state now: a temp file in the same directory, renamed over the old one."""
        seq = self._seq
        self._write(encode(state, seq))
        self._compact(seq, at_least=0)

    def save_soon(self, state: PersistedState) -> None:
        """Write the state from a background thread; a newer one replaces an unwritten one.

        It is encoded here, so the writer holds the GIL only briefly between its system calls
        (a long hold would stall the event loop's next grant for up to a switch interval).
        Call it on the thread that records grants and ends (the event loop).
        """
        seq = self._seq
        data = encode(state, seq)
        with self._cond:
            self._latest = (seq, data)
            if self._thread is None:
                self._thread = threading.Thread(target=self._writer, name="state", daemon=True)
                self._thread.start()
            self._cond.notify()

    def flush(self, timeout: float = 5.0) -> None:
        """Wait until everything handed to `save_soon` is on disk."""
        with self._cond:
            self._cond.wait_for(lambda: self._latest is None and not self._writing, timeout)

    def _writer(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._latest is not None)
                latest, self._latest, self._writing = self._latest, None, True
            assert latest is not None
            try:
                self._write(latest[1])
                self._covered(latest[0])
                self._compact(latest[0])
            except OSError as exc:
                log.error("cannot write agent state to %s: %s", self.path, exc)
            with self._cond:
                self._writing = False
                self._cond.notify_all()

    def _write(self, data: bytes) -> None:
        tmp = self.dir / f".{STATE_FILE}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, self.path)

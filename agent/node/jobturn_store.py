"""What the agent keeps of the coordinator's job turns across its restarts: the highest epoch it
has seen (the fence, with the identity of its leader) and the job turns it holds, in small files
of its state directory.

The fence is fsynced before the call that raised it is answered: an agent that forgot it after a
power loss could take orders from a deposed leader. It rises once per leader change. The turns
are recorded on every change (a prepare, a commit, a release: before each is answered) and not
fsynced, like the agent's own state (`agent.node.state`): they survive the agent's crash, which
is what they are for. Each change is one line appended to the turns file (the whole list), not a
file renamed over the last: on ext4 a rename over a file starts writing its data out, which
cost 0.1-0.2 ms per change on the prepare's path. Loading takes the last line that parses (a
crash can cut the last one short); the file is rewritten with that line alone at start (the
agent saves what it took up), after a write that failed or fell short, and whenever it passes
`TURNS_COMPACT_BYTES`.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from agent.node.state import StateDirError

EPOCH_FILE = "coordination-epoch"
HOLDER_FILE = "coordination-holder"
"""The identity of the leader obeyed in the epoch, as "EPOCH IDENTITY" (a file of its own, so an
older agent still reads the epoch file): it counts only while EPOCH is the epoch file's."""
TURNS_FILE = "job-turns.json"
TURNS_COMPACT_BYTES = 64 * 1024
"""The turns file is cut back to its last line once it is this long."""
log = logging.getLogger(__name__)


class JobTurnStore:
    """The fence and the job turns, under `state_dir`."""

    def __init__(self, state_dir: str | Path) -> None:
        self._dir = Path(state_dir)
        self._turns_fd: int | None = None
        """The turns file, open for appending since the first save."""
        self._turns_bytes = 0
        self.failing = ""
        """Why the last write of the turns failed (a full disk), until one succeeds."""

    def load_epoch(self) -> int:
        """The highest epoch seen before (0 if none); `StateDirError` (one line naming the file)
        if the file cannot be read or holds no epoch: starting from 0 would obey a deposed
        coordinator again."""
        path = self._dir / EPOCH_FILE
        try:
            text = path.read_text().strip()
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as exc:
            raise _unfenced(path, f"cannot be read ({exc})") from None
        if not text.isdigit() or not text.isascii():
            raise _unfenced(path, f"holds {text[:40]!r}, not an epoch")
        return int(text)

    def save_epoch(self, epoch: int, holder: str = "") -> None:
        """Record a higher epoch (and the identity of its leader, if known), durably, before
        the call that raised it is answered."""
        if holder:
            self._write(HOLDER_FILE, f"{epoch} {holder}\n", fsync=True)
        self._write(EPOCH_FILE, f"{epoch}\n", fsync=True)

    def load_holder(self, epoch: int) -> str:
        """The identity of the leader obeyed in `epoch` ("" if unknown); `StateDirError` if the
        file cannot be read."""
        path = self._dir / HOLDER_FILE
        try:
            saved, _, holder = path.read_text().strip().partition(" ")
        except FileNotFoundError:
            return ""
        except (OSError, ValueError) as exc:  # another leader in this epoch would be obeyed
            raise _unfenced(path, f"cannot be read ({exc})") from None
        return holder if saved == str(epoch) else ""

    def load_turns(self) -> list[dict[str, Any]]:
        """The job turns saved last (none if the file is missing or unreadable: said once)."""
        path = self._dir / TURNS_FILE
        try:
            lines = path.read_text().splitlines()
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            log.error("job turns file %s is unreadable (%s); no job turn restored", path, exc)
            return []
        for line in reversed(lines):
            try:
                data = json.loads(line)
            except ValueError:
                continue  # cut short by a crash: the line before is the last whole one
            turns = data.get("turns") if isinstance(data, dict) else None
            if isinstance(turns, list):
                return [t for t in turns if isinstance(t, dict)]
        if any(line.strip() for line in lines):
            log.error("job turns file %s holds no whole record; no job turn restored", path)
        return []

    def save_turns(self, turns: list[dict[str, Any]]) -> None:
        """Record the job turns held now: one line appended (see the module's docstring)."""
        line = (json.dumps({"turns": turns}, sort_keys=True) + "\n").encode()
        if self._turns_fd is None or self._turns_bytes + len(line) > TURNS_COMPACT_BYTES:
            self._rewrite_turns(line)
            return
        try:
            written = os.write(self._turns_fd, line)
        except OSError:
            self.close()  # the next save rewrites the file whole
            raise
        if written < len(line):  # a full disk part-way: nothing may be appended to that half
            self.close()
            raise OSError(
                f"job turns file {self._dir / TURNS_FILE}: only {written} of "
                f"{len(line)} bytes written"
            )
        self._turns_bytes += len(line)

    def record(self, turns: list[dict[str, Any]], strict: bool = False) -> bool:
        """`save_turns`; whether the turns were written. A failure (a full disk) is logged once
        while it lasts (`failing` says why) and raised only if `strict`."""
        try:
            self.save_turns(turns)
        except OSError as exc:
            if str(exc) != self.failing:
                log.error("job turns file %s could not be written: %s", self._dir / TURNS_FILE, exc)
            self.failing = str(exc)
            if strict:
                raise
            return False
        if self.failing:
            log.info("job turns file %s is written again", self._dir / TURNS_FILE)
            self.failing = ""
        return True

    def _rewrite_turns(self, line: bytes) -> None:
        """The turns file with `line` alone (written atomically), then kept open to append."""
        self._write(TURNS_FILE, line.decode(), fsync=False)
        self.close()
        self._turns_fd = os.open(self._dir / TURNS_FILE, os.O_WRONLY | os.O_APPEND)
        self._turns_bytes = len(line)

    def close(self) -> None:
        """Close the turns file (a later save opens it again)."""
        if self._turns_fd is not None:
            os.close(self._turns_fd)
            self._turns_fd = None

    def _write(self, name: str, text: str, fsync: bool) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self._dir, prefix=f".{name}.")
        try:
            with os.fdopen(fd, "w") as out:
                out.write(text)
                if fsync:
                    out.flush()
                    os.fsync(out.fileno())
            os.replace(tmp, self._dir / name)
            if fsync:  # the rename itself, too
                directory = os.open(self._dir, os.O_RDONLY)
                try:
                    os.fsync(directory)
                finally:
                    os.close(directory)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _unfenced(path: Path, why: str) -> StateDirError:
    """The fence cannot be taken up: the agent refuses to start (one line naming the file)."""
    return StateDirError(
        f"{path}: {why}; starting below the coordinator epoch it obeyed would obey a deposed "
        "leader: restore the file, or move it aside once no earlier coordinator leader runs"
    )

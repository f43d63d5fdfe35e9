"""What the agent keeps of the coordinator's job turns across its restarts: the highest epoch it
has seen (the fence) and the job turns it holds, in two small files of its state directory.

The fence is fsynced before the call that raised it is answered: an agent that forgot it after a
power loss could take orders from a deposed leader. It rises once per leader change. The turns
file is written atomically on every change and not fsynced, like the agent's own state
(`agent.node.state`): it survives the agent's crash, which is what it is for.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

EPOCH_FILE = "coordination-epoch"
TURNS_FILE = "job-turns.json"
log = logging.getLogger(__name__)


class JobTurnStore:
    """The fence and the job turns, under `state_dir`."""

    def __init__(self, state_dir: str | Path) -> None:
        self._dir = Path(state_dir)

    def load_epoch(self) -> int:
        """The highest epoch seen before (0 if none, or the file is unreadable: said once)."""
        path = self._dir / EPOCH_FILE
        try:
            return int(path.read_text().strip() or 0)
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as exc:
            log.error("coordination epoch file %s is unreadable (%s); starting from 0", path, exc)
            return 0

    def save_epoch(self, epoch: int) -> None:
        """Record a higher epoch, durably, before the call that raised it is answered."""
        self._write(EPOCH_FILE, f"{epoch}\n", fsync=True)

    def load_turns(self) -> list[dict[str, Any]]:
        """The job turns saved before (none if the file is missing or unreadable: said once)."""
        path = self._dir / TURNS_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            log.error("job turns file %s is unreadable (%s); no job turn restored", path, exc)
            return []
        turns = data.get("turns") if isinstance(data, dict) else None
        return [t for t in turns if isinstance(t, dict)] if isinstance(turns, list) else []

    def save_turns(self, turns: list[dict[str, Any]]) -> None:
        """Replace the saved job turns (atomically)."""
        self._write(TURNS_FILE, json.dumps({"turns": turns}, sort_keys=True), fsync=False)

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

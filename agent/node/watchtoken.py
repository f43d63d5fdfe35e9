"""The watch token: a secret the agent writes to a root-only file, which `WatchEvents` needs."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from agent.node.state import StateDirError
from baton.contract.names import AGENT_WATCH_TOKEN_FILE


def write_watch_token(state_dir: str | Path) -> str:
    """A fresh token, written to `<state_dir>/watch-token` readable by the agent's user only."""
    token = secrets.token_hex(32)
    path = Path(state_dir) / AGENT_WATCH_TOKEN_FILE
    partial = path.with_name(f".{path.name}.partial")
    try:
        partial.unlink(missing_ok=True)
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(token + "\n")
        partial.replace(path)
    except OSError as exc:
        raise StateDirError(
            f"cannot write the watch token {path} ({exc.strerror}); "
            "pass --state-dir (BATON_AGENT_STATE_DIR) pointing at a writable directory"
        ) from None
    return token

"""One agent per state directory: `baton agent` holds a lock on `agent.lock` there while it
runs, so that a second agent given the same directory (beside a socket of its own) is refused
at start, naming the first one's PID, instead of reading the first one's tenants, turns and
parked memory as its own, writing a watch token over the first one's and appending to its
journal. The lock is the kernel's (`flock`, held by the open file): an agent that is killed
leaves none behind."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from agent.node.state import StateDirError

LOCK_FILE = "agent.lock"
log = logging.getLogger(__name__)


@contextlib.contextmanager
def holding(state_dir: str | Path) -> Iterator[None]:
    """Hold `state_dir` for this process until the block ends; `StateDirError` (one line) when
    another process holds it, or the directory cannot be made. A filesystem that takes no lock
    (some network filesystems) is used unlocked, saying so."""
    path = Path(state_dir) / LOCK_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise StateDirError(
            f"state directory {state_dir} is not writable ({exc.strerror}); "
            "pass --state-dir (BATON_AGENT_STATE_DIR) pointing at a writable directory"
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # per open file: two in one process too
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EAGAIN):
                log.warning(
                    "cannot lock %s (%s): a second agent given this state directory would not "
                    "be refused",
                    path, exc.strerror,
                )  # fmt: skip
            else:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
                raise StateDirError(
                    f"another process{f' (PID {holder})' if holder else ''} holds the state "
                    f"directory {state_dir} (a second agent?): stop it, or pass another "
                    "--state-dir (BATON_AGENT_STATE_DIR)"
                ) from None
        else:
            with contextlib.suppress(OSError):  # only what the refusal names
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)

"""One driver per state directory at a time: `baton dra` holds a lock on `dra.lock` there from
its start until it has stopped. A DaemonSet rollout starts the new pod while the old one may
still finish its prepares: the new one waits (bounded) for the old one's lock before it reads
the record and removes orphaned specs, so it neither misses a claim the old one recorded nor
removes a spec the old one is about to record. The lock is the kernel's (`flock`, held by the
open file): a driver that is killed leaves none behind."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
from pathlib import Path

from baton.contract.shutdown import StopSignal

LOCK_FILE = "dra.lock"
log = logging.getLogger(__name__)


class StateDirBusy(Exception):
    """Another process held the state directory for the whole wait; the message says who."""


class StoppedWaiting(Exception):
    """A stop signal came while waiting for the state directory; the message says which."""


def hold(state_dir: Path, wait_s: float, stop: StopSignal | None = None) -> int:
    """Lock `state_dir` for this process, waiting at most `wait_s` for the process that holds
    it to stop (less if `stop` comes: `StoppedWaiting`); the locked file's descriptor (for
    `release`). OSError where it cannot be opened or locked."""
    path = state_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log.warning("%s: waiting up to %g s for it to stop", _holder(fd, path), wait_s)
        if not _wait(fd, wait_s, stop):
            holder = _holder(fd, path)
            os.close(fd)
            if stop is not None and stop.received:
                raise StoppedWaiting(f"stopped on {stop.received} while {holder}") from None
            raise StateDirBusy(f"{holder} for {wait_s:g} s") from None
    except OSError:
        os.close(fd)
        raise
    with contextlib.suppress(OSError):  # only what a refusal names
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _holder(fd: int, path: Path) -> str:
    """Who holds the lock, in words."""
    pid = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return f"another driver{f' (PID {pid})' if pid else ''} holds {path}"


def release(fd: int) -> None:
    """Let the next driver have the state directory."""
    os.close(fd)


def _wait(fd: int, wait_s: float, stop: StopSignal | None) -> bool:
    """Whether `fd` was locked within `wait_s` (and before `stop`). The wait blocks in a thread
    on a duplicate of `fd` (the same open file, so the same lock), which it closes once it has
    the lock: a lock taken after the wait was given up goes once `fd` is closed too."""
    spare, taken, woken = os.dup(fd), threading.Event(), threading.Event()

    def take() -> None:
        try:
            fcntl.flock(spare, fcntl.LOCK_EX)
            taken.set()
            woken.set()
        finally:
            os.close(spare)

    threading.Thread(target=take, name="dra state lock", daemon=True).start()
    if stop is not None:
        stop.also_wake(woken)
    woken.wait(wait_s)
    return taken.is_set()

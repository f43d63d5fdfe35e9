"""A client's session belongs to the process that opened it; a forked child (a DataLoader
worker) inherits a copy of its sockets and state, which it must neither use nor end."""

from __future__ import annotations

import os

from agent.client.errors import BatonError


class SessionOwner:
    """The process that opened a client's session (none yet: any process may open one)."""

    def __init__(self) -> None:
        self.pid = 0

    def opened(self) -> None:
        """The session was opened by this process, or is being opened (a child forked
        meanwhile has a copy of it half open, and of the lock its opening holds), or was
        tried (a child forked after a failed connect makes a Baton of its own too)."""
        self.pid = os.getpid()

    def forked(self) -> bool:
        """True in a forked child of the process that opened the session."""
        return self.pid not in (0, os.getpid())

    def check(self) -> None:
        """`BatonError` in a forked child: its copy of the session is its parent's."""
        if self.forked():
            raise BatonError(
                f"this Baton client's session belongs to process {self.pid}, which forked "
                f"process {os.getpid()} (a DataLoader worker?); create a new Baton in the child"
            )

"""A unix socket a daemon serves gRPC on, made so that only its own daemon ever removes it.

gRPC removes the path it bound when its server stops, whatever socket is there by then: a daemon
stopping after another replaced its socket (a rolling restart, a kubelet that wiped its plugin
directory) would remove the new daemon's. So the server binds a private name in the socket's
directory, which is renamed into place (atomically) once the server listens; gRPC removes the
private name (long gone), and the daemon removes the path only while it is still its own.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from pathlib import Path

UNIX_PATH_MAX = 107
"""The bytes a unix socket's path can have (`sun_path`, less its closing NUL)."""
PRIVATE_NAME_MIN = 8
"""A private name is as long as the socket's name (a path that fits fits privately too), and
at least this long: a dot and seven random hex digits."""


def identity(path: str | Path) -> tuple[int, int, int]:
    """A file's identity: its inode, and when it was made (a deleted socket's inode number is
    soon reused by the next file made in its place); `OSError` when it cannot be read."""
    info = os.stat(path)
    return info.st_dev, info.st_ino, info.st_ctime_ns


class ServedSocket:
    """The socket at `path`: bind the server on `address`, `publish` once it serves, `remove`
    after it stopped."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        length = max(len(self.path.name), PRIVATE_NAME_MIN)
        self.private = self.path.with_name(f".{secrets.token_hex(length)}"[:length])
        """Where the server binds, until `publish` renames it to `path`."""
        self.made: tuple[int, int, int] | None = None
        """The identity of the socket `publish` put at `path`."""

    @property
    def address(self) -> str:
        """The gRPC address to bind the server on (the private name)."""
        return f"unix:{self.private}"

    def publish(self, mode: int | None = None) -> None:
        """Give the listening socket its `mode`, if any, and its path, replacing whatever file
        is there; `OSError` when it cannot be renamed (the private socket is then removed)."""
        try:
            if mode is not None:
                os.chmod(self.private, mode)
            os.replace(self.private, self.path)
        except OSError:
            self.private.unlink(missing_ok=True)
            raise
        self.made = identity(self.path)

    def bind_error(self) -> str:
        """Why the server could not bind the socket (gRPC does not say): its path's length
        against the limit where that is why, else a plain bind's error."""
        size, private = len(os.fsencode(self.path)), len(os.fsencode(self.private))
        if private > UNIX_PATH_MAX:
            longer = private - size
            first = f", bound first under a private name {longer} bytes longer" if longer else ""
            return (
                f"AF_UNIX path too long: it is {size} bytes{first}, and a unix socket's path has"
                f" at most {UNIX_PATH_MAX}"
            )
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(str(self.private))
            except OSError as err:
                return err.strerror or str(err)
        self.private.unlink(missing_ok=True)
        return "gRPC could not bind it"

    def own(self) -> bool:
        """Whether the socket at `path` is the one `publish` put there."""
        try:
            return self.made is not None and identity(self.path) == self.made
        except OSError:
            return False

    def remove(self) -> None:
        """Remove the socket, only while it is this daemon's own (after its server stopped)."""
        with contextlib.suppress(OSError):
            self.private.unlink(missing_ok=True)  # bound, never published: a failed start
            if self.own():
                self.path.unlink()
        self.made = None

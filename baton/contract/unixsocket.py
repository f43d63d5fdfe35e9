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
from collections.abc import Mapping
from pathlib import Path

UNIX_PATH_MAX = 107
"""The bytes a unix socket's path can have (`sun_path`, less its closing NUL)."""
PRIVATE_NAME_MIN = 8
"""The fewest bytes of a private name: a dot and seven random hex digits."""


def length_problem(
    path: str | Path, also: Mapping[str, str] | None = None, served: bool = True
) -> str | None:
    """Why a socket served at `path` cannot be bound, in one line naming its length and the most
    it may have: it, the private name `ServedSocket` binds it under first, or a path bound beside
    it (`also`: each one and what it is) is longer than a unix socket's path can be; None if all
    fit. Every daemon asks this before it serves, so that none starts only to fail at a bind;
    `served=False`: a socket it only connects to, no private name bound for it."""
    path = Path(path)
    too_long = _too_long(path, also or {}, served)
    return f"the socket {path} {too_long}" if too_long else None


def _too_long(path: Path, also: Mapping[str, str], served: bool = True) -> str | None:
    """`length_problem`'s line after the path's name: "is N bytes, over the …"; None if all
    fit."""
    size = len(os.fsencode(path))
    private = {str(_private_path(path)): "the private name it is bound under first"}
    bound = {**(private if served else {}), **also}
    more, what = 0, ""
    for other, described in bound.items():
        longer = len(os.fsencode(other)) - size
        if longer > more:
            more, what = longer, described
    if size + more <= UNIX_PATH_MAX:
        return None
    if not more:
        return f"is {size} bytes, over the {UNIX_PATH_MAX} a unix socket's path may have"
    return (
        f"is {size} bytes, over the {UNIX_PATH_MAX - more} it may have: {what} is {more} bytes "
        f"longer, and a unix socket's path has at most {UNIX_PATH_MAX} bytes"
    )


def unix_target(path: str | Path) -> str:
    """The gRPC target of the socket at `path`, absolute or relative to the working directory
    (gRPC's `unix://` form takes an absolute path only: a relative one is not a valid target)."""
    return f"unix:{path}"


def _private_path(path: Path) -> Path:
    """A private name for the socket at `path`, in its directory: random, as long as its name
    (a path that fits fits privately too) and of at least `PRIVATE_NAME_MIN` bytes."""
    length = max(len(path.name), PRIVATE_NAME_MIN)
    return path.with_name(f".{secrets.token_hex(length)}"[:length])


def identity(path: str | Path) -> tuple[int, int, int]:
    """A file's identity: its inode, and when it was made (a deleted socket's inode number is
    soon reused by the next file made in its place); `OSError` when it cannot be read. "Made" is
    its mtime, which nothing changes on a socket but `touch`: its ctime moves with a chmod, chown
    or rename, which leave it the same socket."""
    info = os.stat(path)
    return info.st_dev, info.st_ino, info.st_mtime_ns


class ServedSocket:
    """The socket at `path`: bind the server on `address`, `publish` once it serves, `remove`
    after it stopped."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.private = _private_path(self.path)
        """Where the server binds, until `publish` renames it to `path`."""
        self.made: tuple[int, int, int] | None = None
        """The identity of the socket `publish` put at `path`."""

    @property
    def address(self) -> str:
        """The gRPC address to bind the server on (the private name)."""
        return unix_target(self.private)

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
        """Why the server could not bind the socket (gRPC does not say), for a line that names
        its path already: its length against the limit where that is why ("it is N bytes, over
        the …", as `length_problem` says it), else a plain bind's error."""
        too_long = _too_long(self.path, {})
        if too_long:
            return f"it {too_long}"
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

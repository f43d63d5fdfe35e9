"""Kubelet restart detection from inotify events on the device-plugins directory.

A restarting kubelet deletes every socket there (ours included) and creates a new
kubelet.sock. Inodes are not compared: a recreated socket often gets the same inode.
When the kernel's event queue overflows, the events it dropped may have been those: the plugin
is told (`EVENTS_LOST`) and looks at the sockets itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import enum
import os
import select
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

IN_CREATE = 0x100
IN_DELETE = 0x200
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_DELETE_SELF = 0x400
IN_IGNORED = 0x8000
IN_Q_OVERFLOW = 0x4000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
_HEADER = struct.Struct("iIII")


class Change(enum.Enum):
    """What happened in the directory that matters to the plugin."""

    KUBELET_SOCKET_CREATED = "kubelet socket created"
    PLUGIN_SOCKET_DELETED = "plugin socket deleted"
    DIRECTORY_GONE = "device-plugins directory gone"
    EVENTS_LOST = "inotify events lost (queue overflow)"


class SocketWatcher:
    """Reports kubelet.sock (re)creation and deletion of the plugin's own socket."""

    def __init__(self, directory: Path, kubelet_socket: str, plugin_socket: str) -> None:
        self.directory = directory
        self.kubelet_socket = kubelet_socket
        self.plugin_socket = plugin_socket
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self._fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        mask = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF
        if libc.inotify_add_watch(self._fd, os.fsencode(directory), mask) < 0:
            err = ctypes.get_errno()
            os.close(self._fd)
            raise OSError(err, f"cannot watch {directory}: {os.strerror(err)}")
        self._directory_id = _identity(directory)
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._lock = threading.Lock()
        self._closed = False

    def changes(self, timeout: float | None = None) -> Iterator[Change]:
        """Changes seen within one wait of at most `timeout` seconds (None: until one or close)."""
        # poll, not select: select refuses a descriptor numbered 1024 or more (a process with
        # many files open, such as a long test run, or a plugin in a larger program)
        poller = select.poll()
        for fd in (self._fd, self._wake_r):
            poller.register(fd, select.POLLIN)
        wait_ms = None if timeout is None else max(0, int(timeout * 1000))
        ready = [fd for fd, _ in poller.poll(wait_ms)]
        if self._wake_r in ready:
            self._drain_wakes()
        if self._fd not in ready:
            return
        try:
            data = os.read(self._fd, 64 * 1024)
        except BlockingIOError:
            return
        yield from self._parse(data)

    def _parse(self, data: bytes) -> Iterator[Change]:
        offset = 0
        while offset + _HEADER.size <= len(data):
            _wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
            raw = data[offset + _HEADER.size : offset + _HEADER.size + length]
            offset += _HEADER.size + length
            name = raw.rstrip(b"\0").decode(errors="replace")
            if mask & IN_Q_OVERFLOW:  # what was dropped may be any change, the directory's too
                gone = _identity(self.directory) != self._directory_id
                yield Change.DIRECTORY_GONE if gone else Change.EVENTS_LOST
            elif mask & (IN_DELETE_SELF | IN_IGNORED):
                yield Change.DIRECTORY_GONE
            elif mask & (IN_CREATE | IN_MOVED_TO) and name == self.kubelet_socket:
                yield Change.KUBELET_SOCKET_CREATED
            elif mask & (IN_DELETE | IN_MOVED_FROM) and name == self.plugin_socket:
                yield Change.PLUGIN_SOCKET_DELETED

    def _drain_wakes(self) -> None:
        """Read the wake pipe empty, so the next `changes()` waits again."""
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            return

    def wake(self) -> None:
        """Make a blocked `changes()` return at once (any thread; nothing after `close`)."""
        with self._lock:
            if self._closed:
                return
            with contextlib.suppress(BlockingIOError):  # full of wakes already: one is enough
                os.write(self._wake_w, b"x")

    def close(self) -> None:
        """Release the inotify descriptor and the wake pipe."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for fd in (self._fd, self._wake_r, self._wake_w):
                os.close(fd)


def _identity(path: Path) -> tuple[int, int] | None:
    """A directory's (device, inode); None when it is gone."""
    try:
        found = path.stat()
    except OSError:
        return None
    return (found.st_dev, found.st_ino)

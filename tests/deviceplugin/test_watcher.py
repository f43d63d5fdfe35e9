"""The device-plugin directory watcher: inotify changes and wakes, over a real directory."""

from __future__ import annotations

import select
import socket
from pathlib import Path

from deviceplugin.watcher import Change, SocketWatcher


def test_a_wake_returns_once_and_the_next_wait_waits_again(tmp_path: Path) -> None:
    """A wake makes one `changes()` return; it must not leave the pipe readable, or every later
    wait returns at once and the plugin's watch loop spins."""
    watcher = SocketWatcher(tmp_path, "kubelet.sock", "baton.sock")
    try:
        for _ in range(3):
            watcher.wake()
        assert list(watcher.changes(5.0)) == []
        wake_pipe = watcher._wake_r
        assert select.select([wake_pipe], [], [], 0)[0] == [], "wakes left unread"
        with socket.socket(socket.AF_UNIX) as kubelet:
            kubelet.bind(str(tmp_path / "kubelet.sock"))
            assert list(watcher.changes(5.0)) == [Change.KUBELET_SOCKET_CREATED]
    finally:
        watcher.close()
    watcher.wake()  # after close (a gRPC thread's late wake): nothing, no error
    watcher.close()

"""The device-plugin directory watcher: inotify changes and wakes, over a real directory."""

from __future__ import annotations

import os
import select
import shutil
import socket
from pathlib import Path

import pytest

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


def overflow(directory: Path) -> None:
    """Fill the inotify queue of a watch on `directory` past its end (one IN_CREATE per file):
    the kernel drops every later event, and queues one IN_Q_OVERFLOW instead."""
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    if limit > 100_000:
        pytest.skip(f"fs.inotify.max_queued_events is {limit}: too many files to overflow it")
    for i in range(limit + 1):
        os.close(os.open(directory / f"flood-{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))


def read_queue(watcher: SocketWatcher) -> list[Change]:
    """The changes of every event queued now (read in 64 KiB batches, the flood's among them)."""
    seen: list[Change] = []
    while select.select([watcher._fd], [], [], 0)[0]:
        seen += watcher.changes(0)
    return seen


def test_a_lost_kubelet_socket_creation_is_reported_as_events_lost(tmp_path: Path) -> None:
    """A kubelet.sock created while the queue is full makes no event: ignoring the overflow, the
    plugin never learnt of the kubelet's restart and never registered with it."""
    watcher = SocketWatcher(tmp_path, "kubelet.sock", "baton.sock")
    try:
        overflow(tmp_path)
        with socket.socket(socket.AF_UNIX) as kubelet:
            kubelet.bind(str(tmp_path / "kubelet.sock"))
            seen = read_queue(watcher)
        assert Change.EVENTS_LOST in seen and Change.KUBELET_SOCKET_CREATED not in seen
    finally:
        watcher.close()


def test_a_directory_removed_while_the_queue_is_full_is_reported_gone(tmp_path: Path) -> None:
    directory = tmp_path / "device-plugins"
    directory.mkdir()
    watcher = SocketWatcher(directory, "kubelet.sock", "baton.sock")
    try:
        overflow(directory)
        shutil.rmtree(directory)
        seen = read_queue(watcher)
        assert Change.DIRECTORY_GONE in seen
    finally:
        watcher.close()


def test_a_watcher_whose_descriptors_are_numbered_past_1024_still_reports(tmp_path: Path) -> None:
    """A process with many files open (a long test run, a plugin in a larger program) gets
    descriptors numbered 1024 and up, which `select` refuses: the wait must not depend on it,
    else the watch thread dies and a kubelet restart is never followed by a registration."""
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        watcher = SocketWatcher(tmp_path, "kubelet.sock", "baton.sock")
        try:
            assert watcher._fd >= 1024
            with socket.socket(socket.AF_UNIX) as kubelet:
                kubelet.bind(str(tmp_path / "kubelet.sock"))
                assert list(watcher.changes(5.0)) == [Change.KUBELET_SOCKET_CREATED]
        finally:
            watcher.close()
    finally:
        for fd in held:
            os.close(fd)

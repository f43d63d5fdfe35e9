"""Finding the local process behind a TCP peer, through /proc."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from agent.node.peers import PeerProcess, peer_process, process_of_socket


def test_a_descriptor_that_closes_during_the_scan_does_not_hide_the_process(
    tmp_path: Path,
) -> None:
    """Promised: a busy process opens and closes descriptors while /proc is read; one that
    cannot be read any more is skipped, not the whole process."""
    fd = tmp_path / "4242" / "fd"
    fd.mkdir(parents=True)
    for n in range(3, 23):  # readlink fails on these, as on descriptors closed meanwhile
        (fd / str(n)).write_text("")
    (fd / "30").symlink_to("socket:[98765]")
    found = process_of_socket(98765, tmp_path)
    assert found == PeerProcess(4242, os.getuid())
    assert process_of_socket(11111, tmp_path) is None


def test_the_peer_of_a_real_loopback_connection_is_this_process() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = server.accept()
            with accepted:
                host, peer_port = client.getsockname()
                found = peer_process(f"ipv4:{host}:{peer_port}", port)
    assert found is not None and found.pid == os.getpid()

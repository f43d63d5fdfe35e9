"""Finding the local process behind a TCP peer, through /proc."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

from agent.node.peers import Callers, PeerProcess, ProcessWatch, peer_process, process_of_socket


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


def test_a_caller_found_once_is_checked_by_its_descriptor_not_by_the_socket_tables(
    tmp_path: Path,
) -> None:
    """The socket tables take milliseconds to read (each call of llm-d's API would pay them):
    a caller found once is known by the descriptor it holds its connection by, while that is
    still the same socket; once it is not (the connection closed, its port maybe another
    process's), the caller is looked up afresh."""
    net, fd = tmp_path / "net", tmp_path / str(os.getpid()) / "fd"
    net.mkdir()
    fd.mkdir(parents=True)
    (net / "tcp").write_text(  # 127.0.0.1:40000 → 127.0.0.1:5000, established, inode 77
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
        "timeout inode\n"
        "   0: 0100007F:9C40 0100007F:1388 01 00000000:00000000 00:00000000 00000000     0 "
        "       0 77 1 0000000000000000 20 4 30 10 -1\n"
    )
    (fd / "9").symlink_to("socket:[77]")

    async def scenario() -> list[PeerProcess | None]:
        watch = ProcessWatch(asyncio.get_running_loop())
        callers = Callers(watch, 5000, tmp_path)
        try:
            first = await callers.of("ipv4:127.0.0.1:40000")
            (net / "tcp").unlink()  # a second look in the tables would find nobody
            again = await callers.of("ipv4:127.0.0.1:40000")
            (fd / "9").unlink()  # the connection closed: its port may be another's now
            (fd / "9").symlink_to("socket:[78]")
            after = await callers.of("ipv4:127.0.0.1:40000")
        finally:
            watch.close()
        return [first, again, after]

    me = PeerProcess(os.getpid(), os.getuid())
    assert asyncio.run(scenario()) == [me, me, None]

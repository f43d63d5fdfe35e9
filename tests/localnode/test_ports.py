"""Ports for daemons on loopback: free, and never from the range outgoing connections draw on."""

from __future__ import annotations

import socket
from pathlib import Path

from commands.localnode import controlplane
from commands.localnode.controlplane import free_ports


def test_free_ports_are_distinct_bindable_and_outside_the_ephemeral_range() -> None:
    first, last = map(int, Path(controlplane.EPHEMERAL_RANGE).read_text().split())
    ports = free_ports(16)
    assert len(set(ports)) == 16
    assert not any(first <= p <= last for p in ports)
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_someone_listens_on_is_never_handed_out(monkeypatch, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ephemeral = tmp_path / "ip_local_port_range"
        ephemeral.write_text(f"{port + 64}\t65535\n")
        monkeypatch.setattr(controlplane, "EPHEMERAL_RANGE", str(ephemeral))
        monkeypatch.setattr(controlplane, "LISTEN_FLOOR", port)
        monkeypatch.setattr(  # the taken port is the first candidate
            controlplane.random, "sample", lambda ports, k: sorted(ports)[:k]
        )
        (given,) = free_ports(1)
        assert port < given < port + 64


def test_a_host_whose_ephemeral_range_leaves_no_room_gets_ports_from_the_kernel(
    monkeypatch, tmp_path: Path
) -> None:
    ephemeral = tmp_path / "ip_local_port_range"
    ephemeral.write_text("1024\t65535\n")
    monkeypatch.setattr(controlplane, "EPHEMERAL_RANGE", str(ephemeral))
    ports = free_ports(3)
    assert len(set(ports)) == 3

"""Ports for daemons on loopback: free, and never from the range outgoing connections draw on."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from commands.localnode import controlplane
from commands.localnode.controlplane import free_ports
from commands.localnode.procs import LocalNodeError


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    ephemeral_low = int(Path(controlplane.EPHEMERAL_RANGE).read_text().split()[0])
    ports = free_ports(16)
    assert len(set(ports)) == 16
    assert all(controlplane.LISTEN_PORTS[0] <= p < ephemeral_low for p in ports)
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_someone_listens_on_is_never_handed_out(monkeypatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setattr(controlplane, "LISTEN_PORTS", (port, port + 1))
        monkeypatch.setattr(controlplane, "EPHEMERAL_RANGE", "/nonexistent")
        with pytest.raises(LocalNodeError, match=f"found 0 of 1 free loopback ports in {port}-"):
            free_ports(1)

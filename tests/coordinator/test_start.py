"""`baton coordinator` refusing at start what it cannot serve, saying why in one line of its own."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from commands.localnode.controlplane import ControlPlane
from tests.coordinator.deployed import LEASE_NS


def test_an_llmd_port_in_use_is_refused_at_start_saying_why(
    control_plane: ControlPlane, core: object, tmp_path: Path
) -> None:
    """gRPC says only that it failed ('cannot listen on 127.0.0.1:N; check --llmd-listen'),
    its reason in a log line of its own."""
    token = tmp_path / "token"
    token.write_text("t" * 32)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        done = subprocess.run(
            [
                sys.executable, "-m", "baton", "coordinator",
                "--kubeconfig", str(control_plane.admin_kubeconfig),
                "--token-file", str(token), "--namespace", LEASE_NS,
                "--llmd-listen", address, "--http-listen", "127.0.0.1:0",
            ],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode == 2, done.stderr
    said = f"cannot listen on {address} (Address already in use); check --llmd-listen"
    assert said in done.stderr and "Traceback" not in done.stderr

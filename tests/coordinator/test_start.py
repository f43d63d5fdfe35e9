"""`baton coordinator` refusing at start what it cannot serve, saying why in one line of its own."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from baton._pb import health_pb2 as hp
from baton._pb import health_pb2_grpc as hp_grpc
from commands.localnode.controlplane import ControlPlane
from commands.localnode.procs import Process, wait_for
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


def test_the_start_line_names_the_ports_it_bound_for_port_0(
    control_plane: ControlPlane, core: object, tmp_path: Path
) -> None:
    """`--llmd-listen 127.0.0.1:0` logs the port the kernel gave, one a client can reach; its
    health service answers for the services it serves, NOT_FOUND for another."""
    token = tmp_path / "token"
    token.write_text("t" * 32)
    log = tmp_path / "coordinator.log"
    started = re.compile(r"llm-d API on 127\.0\.0\.1:(\d+), status on 127\.0\.0\.1:(\d+),")
    coordinator = Process(
        "coordinator",
        [
            sys.executable, "-m", "baton", "coordinator",
            "--kubeconfig", str(control_plane.admin_kubeconfig),
            "--token-file", str(token), "--namespace", LEASE_NS, "--lease", "port-zero",
            "--llmd-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
        ],
        log,
    ).start()  # fmt: skip
    try:

        def start_line() -> str | None:
            coordinator.check()
            lines = log.read_text(errors="replace").splitlines()
            return next((line for line in lines if "campaigning for Lease" in line), None)

        line = wait_for("the start line", start_line, 60)
        found = started.search(line)
        assert found, line
        ports = [int(port) for port in found.groups()]
        assert 0 not in ports, line
        for port in ports:
            socket.create_connection(("127.0.0.1", port), timeout=10).close()
        with grpc.insecure_channel(f"127.0.0.1:{ports[0]}") as channel:  # its health service
            health = hp_grpc.HealthStub(channel)
            for served in ("", "timeslice_orchestrator.v1alpha1.TimeSliceOrchestratorService"):
                health.Check(hp.HealthCheckRequest(service=served), timeout=10)
            with pytest.raises(grpc.RpcError) as unknown:
                health.Check(hp.HealthCheckRequest(service="no.such.Service"), timeout=10)
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        coordinator.stop()

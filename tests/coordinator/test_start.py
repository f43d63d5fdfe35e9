"""`baton coordinator` refusing at start what it cannot serve, saying why in one line of its own."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
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


def test_a_sigterm_while_it_reads_its_token_stops_it_in_order(tmp_path: Path) -> None:
    """The signal comes before the coordinator's event loop handles it (its token file, a pipe
    here, still being read): it was killed there with no line. It must stop before it starts,
    serving and campaigning for nothing: its line and exit status 0."""
    token = tmp_path / "token"
    os.mkfifo(token)
    kubeconfig = tmp_path / "kubeconfig"  # an API server it must not need
    kubeconfig.write_text(
        'apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]'
        "\nusers: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    coordinator = subprocess.Popen(
        [
            sys.executable, "-m", "baton", "coordinator",
            "--kubeconfig", str(kubeconfig), "--token-file", str(token),
            "--llmd-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
        ],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    opened: list[int] = []
    opener = threading.Thread(target=lambda: opened.append(os.open(token, os.O_WRONLY)))
    opener.daemon = True
    opener.start()  # the pipe opens once the coordinator opens it to read its token
    try:
        opener.join(60)
        assert opened, "the coordinator did not read its token file"
        coordinator.send_signal(signal.SIGTERM)
        with contextlib.suppress(OSError):  # a killed one reads no more
            os.write(opened[0], b"t" * 32)
        os.close(opened[0])
        _, err = coordinator.communicate(timeout=60)
    finally:
        coordinator.kill()
        os.close(os.open(token, os.O_RDONLY | os.O_NONBLOCK))  # an opener still waiting goes on
    assert coordinator.returncode == 0, err
    assert "coordinator stopped on SIGTERM" in err and "campaigning" not in err, err

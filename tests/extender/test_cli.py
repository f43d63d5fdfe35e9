"""`baton extender` from the command line: flag checks, and a full run against the fake API."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import httpx
import pytest
from typer.testing import CliRunner

import commands.cli
from baton.contract.names import ANNOTATION_ASSIGNED_GPUS
from tests.extender.builders import node, pod
from tests.harness.fakeapi import FakeApiServer

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
_LOG_READ = threading.Condition()


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--policy", "random"], {}, "'random'; choose one of binpack, spread, complement"),
        ([], {"BATON_EXTENDER_POLICY": "random"}, "choose one of binpack"),
        (["--max-duty", "0"], {}, "0: must be above 0 and at most 1000 (percent)"),
        (["--max-duty", "1500"], {}, "1500: must be above 0 and at most 1000 (percent)"),
        ([], {"BATON_EXTENDER_MAX_DUTY": "nan"}, "nan: must be above 0 and at most 1000"),
        (["--memory-headroom", "-1"], {}, "must be 0 or more MiB"),
        ([], {"BATON_EXTENDER_BINDS_IN_FLIGHT": "0"}, "must be 1 or more"),
        (["--tls-cert", "/x.crt"], {}, "give both --tls-cert and --tls-key"),
        (["--tls-client-ca", "/ca.crt"], {}, "--tls-client-ca: needs --tls-cert and --tls-key"),
        (["--kubeconfig", "/nonexistent/kubeconfig"], {}, "does not exist"),
    ],
)
def test_bad_flags_are_refused_with_a_reason(
    args: list[str], env: dict[str, str], message: str
) -> None:
    result = CliRunner().invoke(commands.cli.app, ["extender", *args], env=env)
    assert result.exit_code == 2
    assert message in re.sub(r"\s+", " ", result.output.replace("│", " "))


def test_a_kubeconfig_that_is_not_yaml_is_refused_in_one_line(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nclusters: [\n")
    result = CliRunner().invoke(
        commands.cli.app, ["extender", "--kubeconfig", str(kubeconfig), "--port", "0"]
    )
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"baton extender: kubeconfig file '{kubeconfig}' is not a kubeconfig: not YAML: "
        "expected the node content, but found '<stream end>' at line 3, column 1\n"
    )


def test_a_host_that_is_not_this_machines_is_named_as_the_flag_to_change(tmp_path: Path) -> None:
    host = "192.0.2.1"  # TEST-NET-1: no machine's own address
    kubeconfig = FakeApiServer().kubeconfig_path(tmp_path)  # read, never reached
    result = CliRunner().invoke(
        commands.cli.app,
        ["extender", "--kubeconfig", str(kubeconfig), "--host", host, "--port", "0"],
    )
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"baton extender: cannot listen on {host}:0 (")
    assert result.output.endswith("); pass another --host (BATON_EXTENDER_HOST)\n")


@contextlib.contextmanager
def running_extender(
    fake_api: FakeApiServer,
    tmp_path: Path,
    lines: list[str] | None = None,
    args: tuple[str, ...] = (),
) -> Iterator[int]:
    """`baton extender` on an ephemeral port, configured through env twins; yields the port.

    On leaving, SIGTERM must end it with exit status 0 within `STOP_TIMEOUT_S`.
    """
    kubeconfig = fake_api.kubeconfig_path(tmp_path)
    env = {
        **os.environ,
        "BATON_KUBECONFIG": str(kubeconfig),
        "BATON_EXTENDER_PORT": "0",
        "BATON_EXTENDER_SHUTDOWN_GRACE": "2",
    }
    command = [
        str(Path(sys.executable).parent / "baton"),
        "extender",
        "--host",
        "127.0.0.1",
        *args,
    ]
    proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    log = [] if lines is None else lines
    reader = threading.Thread(target=_read_log, args=(proc.stderr, log), daemon=True)
    reader.start()
    try:
        yield _port_from_log(log)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=STOP_TIMEOUT_S)
        finally:
            proc.kill()
        reader.join(timeout=STOP_TIMEOUT_S)
        assert code == 0, "".join(log)


def _read_log(stream: IO[str], lines: list[str]) -> None:
    for line in stream:
        with _LOG_READ:
            lines.append(line)
            _LOG_READ.notify_all()
    with _LOG_READ:
        lines.append("")  # end of the log
        _LOG_READ.notify_all()


def _port_from_log(lines: list[str]) -> int:
    def port() -> int | None:
        for line in lines:
            match = re.search(r"serving on http://127\.0\.0\.1:(\d+)", line)
            if match:
                return int(match.group(1))
        return None

    with _LOG_READ:
        _LOG_READ.wait_for(lambda: port() is not None or "" in lines, START_TIMEOUT_S)
        found = port()
    assert found is not None, f"no 'serving on' line: {lines}"
    return found


def test_extender_serves_and_binds_against_the_api_server(
    fake_api: FakeApiServer, tmp_path: Path
) -> None:
    fake_api.put_object(node("gpu-1", gpus=1))
    fake_api.put_object(pod("trainer", memory=1000, duty=40))
    with running_extender(fake_api, tmp_path) as port:
        fake_api.wait_for_requests("watch", "nodes", timeout=START_TIMEOUT_S)
        fake_api.wait_for_requests("watch", "pods", timeout=START_TIMEOUT_S)
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200
        stored = fake_api.get_object("Pod", "trainer")
        assert stored is not None
        args = {"Pod": stored, "Nodes": None, "NodeNames": ["gpu-1"]}
        assert httpx.post(f"{url}/filter", json=args, timeout=10).json()["NodeNames"] == ["gpu-1"]
        bind = {
            "PodName": "trainer",
            "PodNamespace": "default",
            "PodUID": stored["metadata"]["uid"],
            "Node": "gpu-1",
        }
        assert httpx.post(f"{url}/bind", json=bind, timeout=10).json() == {"Error": ""}
        bound = fake_api.get_object("Pod", "trainer")
        assert bound is not None and bound["spec"]["nodeName"] == "gpu-1"
        assert bound["metadata"]["annotations"][ANNOTATION_ASSIGNED_GPUS] == "GPU-gpu-1-0"
        assert "baton_extender_binds_total" in httpx.get(f"{url}/metrics", timeout=10).text


def test_dra_on_a_cluster_without_resource_claims_says_the_api_is_not_served(
    fake_api: FakeApiServer, tmp_path: Path
) -> None:
    """The fake API server, as a cluster before Kubernetes 1.34, serves no resource.k8s.io/v1."""
    fake_api.put_object(node("gpu-1", gpus=1))
    lines: list[str] = []
    with running_extender(fake_api, tmp_path, lines, ("--dra",)) as port:
        with _LOG_READ:
            _LOG_READ.wait_for(
                lambda: (
                    any("resourceclaims: API server answered" in line for line in lines)
                    or "" in lines
                ),
                START_TIMEOUT_S,
            )
        (said,) = [line for line in lines if "resourceclaims: API server answered" in line]
        assert (
            "listing and watching nodes, pods and resourceclaims: API server answered 404: it"
            " serves no resource.k8s.io/v1 resourceclaims (Kubernetes serves it from 1.34 on,"
            " unless its API group is turned off); retrying"
        ) in said
        assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10).status_code == 503


def test_sigterm_stops_serving_and_logs_why(fake_api: FakeApiServer, tmp_path: Path) -> None:
    fake_api.put_object(node("gpu-1", gpus=1))
    lines: list[str] = []
    with running_extender(fake_api, tmp_path, lines) as port:
        fake_api.wait_for_requests("watch", "pods", timeout=START_TIMEOUT_S)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            assert client.get("/readyz").status_code == 200  # a kept-alive connection stays open
    stopped = [line for line in lines if "extender stopped on" in line]
    assert len(stopped) == 1 and "stopped on SIGTERM; watches closed" in stopped[0], lines
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=5):
        pass


def test_a_sigterm_as_soon_as_it_serves_still_stops_it_in_order(
    fake_api: FakeApiServer, tmp_path: Path
) -> None:
    """The signal arrives while the watches start, before the event loop runs: it must not
    kill the process (exit status 0 is `running_extender`'s own check)."""
    lines: list[str] = []
    with running_extender(fake_api, tmp_path, lines):
        pass
    assert [line for line in lines if "stopped on SIGTERM; watches closed" in line], lines


@pytest.fixture
def silent_proxy() -> Iterator[int]:
    """A proxy that takes connections and never answers: through it a watch's stop cannot cut
    its request short (it waits for the join's bound, 5 s, and says so)."""
    listener = socket.create_server(("127.0.0.1", 0))
    with listener:
        yield listener.getsockname()[1]


def _wait_for_line(lines: list[str], text: str) -> None:
    with _LOG_READ:
        _LOG_READ.wait_for(lambda: any(text in line for line in lines) or "" in lines, 30)
    assert any(text in line for line in lines), f"no {text!r} line: {lines}"


@pytest.mark.parametrize("again", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_second_stop_signal_while_the_watches_stop_does_not_kill_it(
    silent_proxy: int, tmp_path: Path, again: signal.Signals
) -> None:
    """The event loop has ended and the watches are stopping: another SIGTERM (or Ctrl-C) must
    not end it there, without its "stopped" line (killed by the signal, or exit status 130)."""
    kubeconfig = tmp_path / "kubeconfig"
    cluster = f'server: "http://127.0.0.1:1", proxy-url: "http://127.0.0.1:{silent_proxy}"'
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: c, cluster: {{{cluster}}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    baton = str(Path(sys.executable).parent / "baton")
    command = [baton, "extender", "--kubeconfig", str(kubeconfig), "--host", "127.0.0.1"]
    env = {**os.environ, "BATON_EXTENDER_PORT": "0"}
    proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    lines: list[str] = []
    reader = threading.Thread(target=_read_log, args=(proc.stderr, lines), daemon=True)
    reader.start()
    try:
        _port_from_log(lines)
        proc.send_signal(signal.SIGTERM)
        _wait_for_line(lines, "the watch did not stop in time")  # the first of two watches
        proc.send_signal(again)
        code = proc.wait(timeout=STOP_TIMEOUT_S)
    finally:
        proc.kill()
        reader.join(timeout=STOP_TIMEOUT_S)
    assert code == 0, "".join(lines)
    assert any("extender stopped on SIGTERM; watches closed" in line for line in lines), lines

"""What each daemon does when something it needs is missing at start, run as real processes.

It either waits, having said once what is missing and that it waits (the kubelet's directory
and socket, the API server), or exits non-zero with one line naming what is missing and what
to pass (a kubeconfig, a TLS file, a port, a directory, /proc): never a traceback.
"""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from commands.localnode.controlplane import free_ports
from tests.e2e.processes import Daemon, poll
from tests.harness.fakeapi import FakeApiServer
from tests.harness.kubelet import KubeletStub

from .figures import record

pytestmark = pytest.mark.timeout(90)
NODE = "node-1"
UNREACHABLE = "API server unreachable"


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port on 0.0.0.0 something already listens on."""
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.fixture
def down_api(tmp_path: Path) -> Iterator[tuple[FakeApiServer, Path]]:
    """A fake API server that has been stopped (its kubeconfig names where it will come back)."""
    api = FakeApiServer().start()
    api.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    kubeconfig = api.kubeconfig_path(tmp_path)
    api.stop()
    try:
        yield api, kubeconfig
    finally:
        api.stop()


def agent_args(tmp: Path, *extra: str) -> list[str]:
    return [
        "agent", "--socket", f"{tmp}/run/agent.sock", "--state-dir", f"{tmp}/state",
        "--http-host", "127.0.0.1", "--http-port", "0", *extra,
    ]  # fmt: skip


LLMD_GROUP_OF_ANOTHER_GPU = (
    "--backend", "fake", "--fake-gpus", "1x64",
    "--llmd-listen", "127.0.0.1:0", "--llmd-group", "trainers=GPU-0",
)  # fmt: skip


def plugin_args(tmp: Path, *extra: str) -> list[str]:
    return ["deviceplugin", "--node-name", NODE, "--fake-gpus", "1x100", "--kubeconfig", *extra]


def extender_args(tmp: Path, *extra: str) -> list[str]:
    return ["extender", "--kubeconfig", f"{tmp}/kc", "--port", "0", *extra]


def exits(args: list[str]) -> tuple[int, list[str]]:
    """Run `baton ARGS` to its exit (bounded); its status and stderr lines."""
    daemon = Daemon(args[0], args, {})
    try:
        daemon.proc.wait(timeout=30)
    finally:
        status = daemon.stop()
    return status, [line.rstrip("\n") for line in daemon.lines if line.strip()]


Case = Callable[[Path, int], list[str]]
EXIT_CASES: dict[str, tuple[Case, int, str]] = {
    "agent: kubeconfig missing": (
        lambda t, _: agent_args(t, "--node-name", NODE, "--kubeconfig", f"{t}/none"),
        2,
        "kubeconfig file",
    ),
    "agent: /proc missing": (
        lambda t, _: agent_args(t, "--node-name", NODE, "--proc-root", f"{t}/none"),
        2,
        "pass --proc-root",
    ),
    "agent: socket directory impossible": (
        lambda t, _: agent_args(t, "--socket", f"{t}/a-file/agent.sock"),
        2,
        "cannot create the socket",
    ),
    "agent: state directory impossible": (
        lambda t, _: agent_args(t, "--state-dir", f"{t}/a-file/state"),
        2,
        "state directory",
    ),
    "agent: status port taken": (
        lambda t, port: agent_args(t, "--http-host", "0.0.0.0", "--http-port", str(port)),
        2,
        "pass another --http-port",
    ),
    "agent: status host not this node's": (
        lambda t, _: agent_args(t, "--http-host", "192.0.2.1", "--http-port", "0"),
        2,
        "pass another --http-host",
    ),
    "agent: llm-d group names a GPU the node lacks": (
        lambda t, _: agent_args(t, *LLMD_GROUP_OF_ANOTHER_GPU, "--fake-dir", f"{t}/fake"),
        2,
        "--llmd-group trainers=GPU-0: GPU-0: not a GPU of this node",
    ),
    "deviceplugin: kubeconfig missing": (
        lambda t, _: plugin_args(t, f"{t}/none"),
        1,
        "kubeconfig file",
    ),
    "deviceplugin: no GPUs": (
        lambda t, _: ["deviceplugin", "--node-name", NODE, "--kubeconfig", f"{t}/kc"],
        1,
        "--fake-gpus",
    ),
    "deviceplugin: metrics port taken": (
        lambda t, port: plugin_args(
            t, f"{t}/kc", "--metrics-port", str(port), "--device-plugin-dir", str(t)
        ),
        1,
        "pass another --metrics-port",
    ),
    "extender: TLS certificate missing": (
        lambda t, _: extender_args(t, "--tls-cert", f"{t}/none.crt", "--tls-key", f"{t}/none.key"),
        2,
        "--tls-cert",
    ),
    "extender: TLS certificate not PEM": (
        lambda t, _: extender_args(t, "--tls-cert", f"{t}/a-file", "--tls-key", f"{t}/a-file"),
        2,
        "do not load as a certificate",
    ),
    "extender: kubeconfig missing": (
        lambda t, _: ["extender", "--kubeconfig", f"{t}/none", "--port", "0"],
        2,
        "kubeconfig file",
    ),
    "extender: port taken": (
        lambda t, port: ["extender", "--kubeconfig", f"{t}/kc", "--port", str(port)],
        2,
        "pass another --port",
    ),
}


@pytest.mark.parametrize("case", list(EXIT_CASES))
def test_a_daemon_missing_what_it_cannot_do_without_exits_with_one_line(
    case: str, tmp_path: Path, busy_port: int
) -> None:
    """Promised: a non-zero status and one line `baton <daemon>: <what is missing>`."""
    make, status, says = EXIT_CASES[case]
    (tmp_path / "a-file").write_text("not a directory, not a certificate\n")
    FakeApiServer().kubeconfig_path(tmp_path).rename(tmp_path / "kc")  # a server never started
    args = make(tmp_path, busy_port)
    code, lines = exits(args)
    said = [line for line in lines if line.startswith(f"baton {args[0]}: ")]
    assert code == status, lines
    assert not [line for line in lines if "Traceback" in line], "\n".join(lines)
    assert len(said) == 1 and says in said[0], lines
    record("faults", f"missing at start, {case}", {"exit_status": code, "lines": len(lines)})


def count(daemon: Daemon, fragment: str) -> int:
    return sum(fragment in line for line in list(daemon.lines))


def get_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def test_the_agent_waits_for_the_api_server_and_says_so_once(tmp_path: Path, down_api) -> None:
    """Promised: with the API server down at start, the agent serves, says once that it is
    unreachable and what that means, and picks the pods up when it answers."""
    api, kubeconfig = down_api
    (tmp_path / "proc").mkdir()
    args = agent_args(tmp_path, "--node-name", NODE, "--kubeconfig", str(kubeconfig))
    agent = Daemon("agent", [*args, "--proc-root", str(tmp_path / "proc")], {})
    try:
        agent.wait_for_line(f"watch of node {NODE}'s pods: {UNREACHABLE}.*retrying", 30)
        agent.wait_for_line("agent ready", 10)
        api.start()
        agent.wait_for_line("answers again after", 60)
        assert count(agent, UNREACHABLE) == 1, agent.log()
    finally:
        code = agent.stop()
    assert code == 0, agent.log()  # its pod watch ended before the interpreter did
    assert "agent stopped on SIGTERM" in agent.log() and "Traceback" not in agent.log()
    record("faults", "agent started before the API server", {"warnings": count(agent, "WARN")})


def test_the_device_plugin_waits_for_the_kubelets_directory_and_socket(tmp_path: Path) -> None:
    """Promised: started before the kubelet made its directory, the plugin says once that it
    waits for it; once it exists but has no kubelet.sock, once that it waits for the kubelet;
    then it registers."""
    plugin_dir = tmp_path / "device-plugins"
    with FakeApiServer() as api:
        api.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        args = ["deviceplugin", "--node-name", NODE, "--fake-gpus", "1x100", "--kubeconfig"]
        args += [str(api.kubeconfig_path(tmp_path)), "--device-plugin-dir", str(plugin_dir)]
        plugin = Daemon("deviceplugin", [*args, "--metrics-port", "0"], {})
        kubelet = KubeletStub(plugin_dir)
        try:
            plugin.wait_for_line("does not exist \\(yet\\); waiting for the kubelet", 30)
            plugin_dir.mkdir()
            plugin.wait_for_line("not registered: cannot reach the kubelet.*retrying", 30)
            kubelet.start()
            plugin.wait_for_line("registered baton.dev/gpu with the kubelet", 30)
            waits = {
                "directory_waits_said": count(plugin, "does not exist (yet)"),
                "kubelet_waits_said": count(plugin, "not registered"),
            }
            assert waits == {"directory_waits_said": 1, "kubelet_waits_said": 1}, plugin.log()
        finally:
            assert plugin.stop() == 0, plugin.log()
            kubelet.stop()
    assert "Traceback" not in plugin.log()
    record("faults", "device plugin started before the kubelet", waits)


def test_the_extender_waits_for_the_api_server_and_is_not_ready_meanwhile(
    tmp_path: Path, down_api
) -> None:
    """Promised: with the API server down at start, the extender serves, says once that it is
    unreachable, answers /readyz 503, and is ready once the API server answers."""
    api, kubeconfig = down_api
    # Not one the kernel hands out: the down API server's port is free too, and was one.
    (port,) = free_ports(1)
    args = ["extender", "--kubeconfig", str(kubeconfig), "--port", str(port)]
    extender = Daemon("extender", [*args, "--host", "127.0.0.1"], {})
    try:
        extender.wait_for_line(f"nodes and pods: .*{UNREACHABLE}.*retrying", 30)
        extender.wait_for_line("serving on", 10)
        ready = f"http://127.0.0.1:{port}/readyz"
        before = get_status(ready)
        assert before == 503
        api.start()
        extender.wait_for_line("answers again after", 60)
        assert count(extender, UNREACHABLE) == 1, extender.log()
        after = poll(
            "/readyz answering 200",
            lambda: get_status(ready) if get_status(ready) == 200 else None,
            30,
        )
        warnings = count(extender, UNREACHABLE)
    finally:
        assert extender.stop() == 0, extender.log()
    assert "Traceback" not in extender.log()
    figures = {"readyz_before": before, "readyz_after_api_back": after}
    record("faults", "extender started before the API server", figures | {"warnings": warnings})

"""`baton agent` refuses what it cannot use; `baton status` shows what the agent reports."""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.client import Baton
from agent.node.state import PersistedState, StateStore
from agent.node.tenants import Tenant
from agent.parking.backends.fake import FakeBackend
from agent.parking.fakegpu import FakeGpuMemory
from baton.contract.names import MIB, fake_gpu_uuid
from commands.cli import app
from tests.harness.agent import ROOT, AgentRunner


def test_agent_refuses_an_unwritable_state_dir(workdir: str, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = CliRunner().invoke(
        app,
        ["agent", "--socket", f"{workdir}/a.sock", "--state-dir", str(blocker / "state")],
    )
    assert result.exit_code == 2
    assert "not writable" in result.output and "--state-dir" in result.output


def test_a_second_agent_on_a_running_agents_state_dir_is_refused_and_takes_nothing(
    workdir: str,
) -> None:
    """Given a socket of its own, it started beside the first: it read the first one's tenants,
    turns and parked memory as its own, wrote its watch token over the first one's (whose
    `baton events` were then refused) and appended to the same journal."""
    state = f"{workdir}/state"

    def agent(socket: str) -> list[str]:
        where = ["--socket", f"{workdir}/{socket}", "--state-dir", state, "--http-port", "0"]
        return [sys.executable, "-m", "baton", "agent", *where]

    first = subprocess.Popen(agent("a.sock"), stderr=subprocess.PIPE, text=True, cwd=ROOT)
    said: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in first.stderr or ():
            said.put(line)

    threading.Thread(target=read, daemon=True).start()
    try:
        while "agent ready" not in said.get(timeout=30):
            pass
        token = Path(state, "watch-token").read_text()
        second = subprocess.run(
            agent("b.sock"), capture_output=True, text=True, timeout=60, cwd=ROOT
        )
        assert second.returncode == 2, second.stderr
        assert second.stderr == (
            f"baton agent: another process (PID {first.pid}) holds the state directory {state} "
            "(a second agent?): stop it, or pass another --state-dir (BATON_AGENT_STATE_DIR)\n"
        )
        assert Path(state, "watch-token").read_text() == token
        assert not Path(workdir, "b.sock").exists()
    finally:
        first.terminate()
        first.wait(30)


def test_status_renders_holders_and_queues(agent: AgentRunner) -> None:
    with Baton(agent.socket, ["GPU-0"], name="shown") as baton:
        baton.acquire()
        url = agent.http_url
        table = CliRunner().invoke(app, ["status", "--url", url])
        assert table.exit_code == 0, table.output
        assert "GPU-0" in table.output and "local/shown" in table.output
        raw = CliRunner().invoke(app, ["status", "--url", url, "--json"])
        document = json.loads(raw.output)
        assert document["gpus"]["GPU-0"]["holder"] == "local/shown"


def test_status_says_when_the_agent_is_unreachable(workdir: str) -> None:
    result = CliRunner().invoke(app, ["status", "--url", "http://127.0.0.1:9"])
    assert result.exit_code == 1 and "cannot reach the agent" in result.output


def test_events_prints_the_agents_event_stream(agent: AgentRunner) -> None:
    command = [sys.executable, "-c", "from commands.cli import main; main()", "events"]
    where = ["--socket", agent.socket, "--state-dir", agent.config.state_dir]
    watcher = subprocess.Popen(
        [*command, *where, "--count", "4", "--json"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert watcher.stdout is not None
        assert json.loads(watcher.stdout.readline())["kind"] == "watching"
        with Baton(agent.socket, ["GPU-0"], name="watched") as baton:  # joined, connected
            baton.acquire()  # queued, granted
        out, _ = watcher.communicate(timeout=30)
    finally:
        watcher.kill()
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["kind"] for e in events] == ["tenant_joined", "connected", "queued", "granted"]
    assert events[-1]["fencing_tokens"] == {"GPU-0": 1}
    assert watcher.returncode == 0


def test_events_refuses_a_negative_count(workdir: str) -> None:
    where = ["--socket", f"{workdir}/a.sock"]
    result = CliRunner().invoke(app, ["events", *where, "--count", "-1"], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert "Invalid value for '--count': Input should be greater than or equal to 0" in (
        result.output
    )


def test_agent_refuses_a_malformed_llmd_group(workdir: str) -> None:
    result = CliRunner().invoke(
        app, ["agent", "--socket", f"{workdir}/a.sock", "--llmd-group", "trainers"]
    )
    assert result.exit_code == 2
    assert "NAME=GPU" in result.output and "--llmd-group" in result.output


def test_agent_refuses_a_damaged_state_file_in_one_line(workdir: str, tmp_path: Path) -> None:
    (tmp_path / "agent-state.json").write_text('{"tenants": [{"tenant_id": "local/a"}]}')
    where = ["--socket", f"{workdir}/a.sock", "--state-dir", str(tmp_path), "--http-port", "0"]
    result = CliRunner().invoke(app, ["agent", *where])
    assert result.exit_code == 2
    assert "agent-state.json: not a state this agent wrote" in result.output
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output


@pytest.mark.parametrize("epoch", ["garbage", "", "-3"])
def test_agent_refuses_a_damaged_coordination_epoch_in_one_line(
    workdir: str, tmp_path: Path, epoch: str
) -> None:
    """Starting from epoch 0 instead would obey a deposed coordinator leader again."""
    (tmp_path / "coordination-epoch").write_text(epoch)
    (tmp_path / "token").write_text("s3cret")
    where = ["--socket", f"{workdir}/a.sock", "--state-dir", str(tmp_path), "--http-port", "0"]
    token = tmp_path / "token"
    join = ["--coordination-listen", "127.0.0.1:0", "--coordination-token-file", str(token)]
    result = CliRunner().invoke(app, ["agent", *where, *join])
    assert result.exit_code == 2, result.output
    assert f"{tmp_path / 'coordination-epoch'}: holds {epoch!r}, not an epoch" in result.output
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output
    assert (tmp_path / "coordination-epoch").read_text() == epoch  # left for the operator


def test_agent_refuses_a_damaged_record_of_parked_memory_in_one_line(
    workdir: str, tmp_path: Path
) -> None:
    (tmp_path / "agent-state.json").write_text('{"parked": {"methods": ["cuda"]}}')
    where = ["--socket", f"{workdir}/a.sock", "--state-dir", str(tmp_path), "--http-port", "0"]
    result = CliRunner().invoke(app, ["agent", *where])
    assert result.exit_code == 2
    assert "agent-state.json: its record of parked memory is not one" in result.output
    assert "'methods' is a JSON list, not an object" in result.output
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output


@pytest.mark.parametrize("backend", ["none", "fake", "fake,app"])
def test_agent_refuses_memory_parked_by_a_method_it_was_restarted_without(
    workdir: str, tmp_path: Path, backend: str
) -> None:
    """An agent restarted with another --backend neither gives the tenants parked by the cuda
    method turns on memory still parked nor forgets it at its next snapshot."""
    parked = {"local/a": {"pids": {"4242": {"GPU-fake-0000": 1 << 20}}}}  # the cuda method's
    tenant = Tenant(tenant_id="local/a", name="a", gpus=("GPU-fake-0000",))
    StateStore(tmp_path).save(PersistedState(tenants=[tenant], parked=parked))
    where = ["--socket", f"{workdir}/a.sock", "--state-dir", str(tmp_path), "--http-port", "0"]
    fake = ["--fake-dir", f"{workdir}/gpus", "--fake-gpus", "1x100"]
    argv = [sys.executable, "-m", "baton", "agent", *where, *fake, "--backend", backend]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 2, result.stderr
    assert "holds memory parked by cuda: local/a" in result.stderr
    assert "cuda among --backend" in result.stderr and "Traceback" not in result.stderr
    assert StateStore(tmp_path).load().parked == parked


def test_agent_refuses_memory_parked_on_a_fake_gpu_it_was_restarted_without(workdir: str) -> None:
    gpus = {fake_gpu_uuid(0): 100 * MIB, fake_gpu_uuid(1): 100 * MIB}
    backend = FakeBackend(f"{workdir}/gpus", gpus)
    FakeGpuMemory("local/a", backend.root).allocate(fake_gpu_uuid(1), 8)
    backend.park("local/a", fake_gpu_uuid(1))  # as an agent with two GPUs left it
    backend.close()
    where = ["--socket", f"{workdir}/a.sock", "--state-dir", f"{workdir}/state", "--http-port", "0"]
    fake = ["--backend", "fake", "--fake-dir", f"{workdir}/gpus", "--fake-gpus", "1x100"]
    argv = [sys.executable, "-m", "baton", "agent", *where, *fake]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 2, result.stderr
    assert f"parked on {fake_gpu_uuid(1)}, which --fake-gpus no longer" in result.stderr
    assert "Traceback" not in result.stderr


def test_events_ends_saying_the_agent_stops_and_holds_no_stop_for_its_grace(
    workdir: str, caplog: pytest.LogCaptureFixture
) -> None:
    agent = AgentRunner(workdir, shutdown_grace=20).start()
    command = [sys.executable, "-m", "baton", "events", "--socket", agent.socket]
    watcher = subprocess.Popen(
        [*command, "--state-dir", agent.config.state_dir],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert watcher.stdout is not None
        assert "watching" in watcher.stdout.readline()
        began = time.monotonic()
        agent.stop()
        stopped_in = time.monotonic() - began
        _, err = watcher.communicate(timeout=30)
    finally:
        agent.stop()
        watcher.kill()
    assert stopped_in < 10, f"the agent took {stopped_in:.1f} s to stop (its grace is 20 s)"
    assert watcher.returncode == 1
    assert err == (
        f"baton events: the watch of the agent at {agent.socket} ended: the agent is stopping; "
        "watch again once it is back\n"
    )
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


HELD_PLUGIN = """import socket, sys
held = socket.socket(socket.AF_UNIX)
held.connect(sys.argv[1])
held.sendall(b"started")
print(held.makefile().read())
"""
"""A kubeconfig's credential plugin that says it started, then waits for its credential."""


def test_a_sigterm_while_the_agent_loads_its_kubeconfig_stops_it_in_order(workdir: str) -> None:
    """The signal comes before the agent's event loop handles it (its kubeconfig's credential
    plugin still running): the agent stopped there, killed, with no line. It must stop as it
    starts, serving nothing: its line and exit status 0."""
    plugin, held = Path(workdir, "plugin.py"), f"{workdir}/plugin.sock"
    plugin.write_text(HELD_PLUGIN)
    api_version = "client.authentication.k8s.io/v1"
    run = {"command": sys.executable, "args": [str(plugin), held], "interactiveMode": "Never"}
    user = {"exec": {"apiVersion": api_version, **run}}
    kubeconfig = Path(workdir, "kubeconfig")
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    state = f"{workdir}/state"
    where = ["--socket", f"{workdir}/a.sock", "--state-dir", state, "--http-port", "0"]
    node = ["--node-name", "n1", "--kubeconfig", str(kubeconfig)]
    command = [sys.executable, "-m", "baton", "agent", *where, *node]
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(held)
        listener.listen(1)
        listener.settimeout(30)
        proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(30)
                assert conn.recv(16) == b"started"
                proc.send_signal(signal.SIGTERM)
                credential = {
                    "apiVersion": api_version,
                    "kind": "ExecCredential",
                    "status": {"token": "t"},
                }
                with contextlib.suppress(OSError):  # the agent killed: the plugin may be gone
                    conn.sendall(json.dumps(credential).encode())
            _, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
    assert proc.returncode == 0, err
    assert f"agent stopped on SIGTERM; tenants, leases and parked memory kept in {state}" in err
    assert "agent ready" not in err and not Path(workdir, "a.sock").exists()

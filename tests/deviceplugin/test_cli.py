"""`baton deviceplugin` and `baton bench allocate` as processes, configured through env twins."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from baton.contract import names
from commands.cli import app
from deviceplugin.daemon import SYNC_TIMEOUT_S
from nodegpu.gpus import DiscoveryError, discover_nvml
from tests.deviceplugin.conftest import NODE, tenant_pod
from tests.deviceplugin.test_allocate import GPU1

BATON = [sys.executable, "-c", "from commands.cli import main; main()"]


def test_without_gpus_or_fake_gpus_it_exits_saying_which_is_missing(socket_dir):
    try:
        discover_nvml()
    except DiscoveryError:
        pass
    else:
        pytest.skip("this machine has an NVIDIA GPU")
    env = {"NODE_NAME": NODE, "BATON_DEVICE_PLUGIN_DIR": str(socket_dir)}
    result = CliRunner().invoke(app, ["deviceplugin"], env=env)
    assert result.exit_code == 1
    assert "no NVIDIA GPU found" in result.output and "--fake-gpus" in result.output


def test_a_negative_host_memory_budget_is_refused_at_start(socket_dir):
    """The budget is published for the extender, which would refuse the node for it instead."""
    env = {
        "NODE_NAME": NODE,
        "BATON_FAKE_GPUS": "1x1024",
        "BATON_DEVICE_PLUGIN_DIR": str(socket_dir),
        "BATON_HOST_MEMORY_BUDGET": "-5",
    }
    result = CliRunner().invoke(app, ["deviceplugin"], env=env)
    assert result.exit_code == 2  # a usage mistake
    assert result.output == (
        "baton deviceplugin: --host-memory-budget '-5': MiB must be 0 or more\n"
    )


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("", "--node-name (NODE_NAME) is empty: give this node's name"),
        ("Node_1", "--node-name: node 'Node_1' is not a Kubernetes name"),
    ],
)
def test_a_node_name_no_node_can_have_is_refused_at_start(socket_dir, name, said):
    """An empty name would watch every unscheduled pod (`spec.nodeName=`) and annotate none."""
    env = {"BATON_FAKE_GPUS": "1x1024", "BATON_DEVICE_PLUGIN_DIR": str(socket_dir)}
    result = CliRunner().invoke(app, ["deviceplugin", "--node-name", name], env=env)
    assert result.exit_code == 2  # a usage mistake
    assert result.output.startswith(f"baton deviceplugin: {said}")
    assert len(result.output.splitlines()) == 1


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"- memoryMiB: 100\n  model: [a\n", "is not valid JSON/YAML: "),
        (b"\xff\xfe- memoryMiB: 100\n", "cannot be read: "),
        (None, "cannot be read: "),  # /proc/self/mem: a file whose read fails (EIO)
    ],
)
def test_a_fake_gpu_file_it_cannot_use_is_refused_in_one_line_naming_the_flag(
    socket_dir, content, said
):
    """A YAML error spans several lines, and an undecodable or unreadable file was a codec
    error naming neither the file nor the flag, or a traceback."""
    path = Path("/proc/self/mem")
    if content is not None:
        path = socket_dir / "gpus.yaml"
        path.write_bytes(content)
    env = {
        "NODE_NAME": NODE,
        "BATON_FAKE_GPUS": str(path),
        "BATON_DEVICE_PLUGIN_DIR": str(socket_dir),
    }
    result = CliRunner().invoke(app, ["deviceplugin"], env=env)
    assert result.exit_code == 1
    assert result.output.startswith(f"baton deviceplugin: --fake-gpus file {path} {said}")
    assert len(result.output.splitlines()) == 1, result.output


def daemon_env(fake_api, socket_dir, plugin_dir, gpus):
    """`baton deviceplugin`'s environment: simulated `gpus`, the fake API server, any port."""
    return os.environ | {
        "NODE_NAME": NODE,
        "BATON_FAKE_GPUS": gpus,
        "BATON_DEVICE_PLUGIN_DIR": str(plugin_dir),
        "BATON_KUBECONFIG": str(fake_api.kubeconfig_path(socket_dir)),
        "BATON_DEVICE_PLUGIN_METRICS_PORT": "0",
    }


def test_a_device_plugin_dir_that_is_a_file_is_refused_at_once(socket_dir, fake_api):
    blocker = socket_dir / "a-file"
    blocker.write_text("not a directory")
    env = daemon_env(fake_api, socket_dir, blocker, "1x1024")
    done = subprocess.run(
        [*BATON, "deviceplugin"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr  # before the pods' listing (up to 10 s)
    said = " ".join(done.stderr.replace("│", " ").split())  # the usage box undone
    assert f"(BATON_DEVICE_PLUGIN_DIR): {blocker} is not a directory" in said
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("exists", [True, False], ids=["directory-there", "directory-to-come"])
def test_a_plugin_socket_path_too_long_to_bind_is_refused_at_once_saying_why(
    socket_dir, fake_api, exists
):
    """A directory the kubelet had not made yet was waited for, then tried again and again up to
    5 s apart, the plugin never serving; one that existed was refused only at the bind."""
    deep = socket_dir / ("d" * 110)  # the socket's path is longer than a unix socket's can be
    if exists:
        deep.mkdir()
    env = daemon_env(fake_api, socket_dir, deep, "1x1024") | {"BATON_POD_RESOURCES_SOCKET": ""}
    done = subprocess.run(
        [*BATON, "deviceplugin"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, done.stderr
    path = deep / names.DEVICE_PLUGIN_SOCKET_NAME
    assert done.stderr.splitlines()[-1] == (
        f"baton deviceplugin: the socket {path} is {len(bytes(path))} bytes, over the 107 a unix "
        "socket's path may have: pass a shorter --device-plugin-dir (BATON_DEVICE_PLUGIN_DIR)"
    )
    assert "Traceback" not in done.stderr
    assert deep.exists() == exists, "nothing made"


def test_a_pod_resources_socket_too_long_to_connect_to_is_refused_at_once(socket_dir, fake_api):
    """It was taken, and every reconciliation then failed with gRPC's 'the target uri is not
    valid' and a hint to mount the kubelet's directory. A socket only connected to may have
    all 107 bytes, whatever its name's length (no private name is bound for it)."""
    far = socket_dir / ("d" * (107 - len(bytes(socket_dir / "k.sock")))) / "k.sock"
    assert len(bytes(far)) == 108
    env = daemon_env(fake_api, socket_dir, socket_dir, "1x1024")
    env["BATON_POD_RESOURCES_SOCKET"] = str(far)
    done = subprocess.run(
        [*BATON, "deviceplugin"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"baton deviceplugin: the socket {far} is 108 bytes, over the 107 a unix socket's path "
        "may have: pass a shorter --pod-resources-socket (BATON_POD_RESOURCES_SOCKET)"
    )
    assert "Traceback" not in done.stderr
    assert not (socket_dir / names.DEVICE_PLUGIN_SOCKET_NAME).exists(), "nothing served"


def test_daemon_serves_kubelet_api_and_metrics(socket_dir, kubelet, fake_api):
    fake_api.put_object(tenant_pod("tenant", (GPU1,), assigned_at_ns=1))
    env = daemon_env(fake_api, socket_dir, socket_dir, "2x1024") | {
        "BATON_DEVICE_PLUGIN_METRICS_HOST": "127.0.0.1",
        "BATON_SLOTS_PER_GPU": "2",
        "PYTHONFAULTHANDLER": "1",
    }
    proc = subprocess.Popen([*BATON, "deviceplugin"], env=env, stderr=subprocess.PIPE, text=True)
    port: list[int] = []
    lines: list[str] = []
    seen = threading.Event()

    def read_log() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            found = re.search(r"metrics on :(\d+)", line)
            if found:
                port.append(int(found.group(1)))
                seen.set()

    reader = threading.Thread(target=read_log, daemon=True)
    reader.start()
    try:
        kubelet.wait_for_registrations(1, timeout=20)
        devices = kubelet.wait_for_list(names.RESOURCE_GPU, bool)
        assert len(devices) == 4
        _, response = kubelet.admit(names.RESOURCE_GPU, 1)
        assert response.envs[names.ENV_GPUS] == GPU1
        assert seen.wait(10), "the daemon never logged its metrics port"
        url = f"http://127.0.0.1:{port[0]}/metrics"
        with urllib.request.urlopen(url, timeout=5) as reply:
            text = reply.read().decode()
        assert 'baton_deviceplugin_allocations_total{outcome="ok"} 1.0' in text
        assert 'baton_deviceplugin_devices{health="Healthy"} 4.0' in text
        assert 'baton_deviceplugin_registrations_total{outcome="ok"} 1.0' in text
        assert "baton_deviceplugin_allocate_seconds_bucket" in text
        assert "baton_deviceplugin_fallback_assignments_total 0.0" in text
        with urllib.request.urlopen(f"http://127.0.0.1:{port[0]}/readyz", timeout=5) as reply:
            assert reply.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        code: int | None = None
        try:  # within the grace its pod gets (terminationGracePeriodSeconds: 30)
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # its log names the part that did not stop, and
            proc.send_signal(signal.SIGABRT)  # faulthandler prints where every thread is
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)
        reader.join(timeout=5)
        if code is None:  # raised here, a failure of the test's body stays shown beside it
            said = "".join(lines)
            raise AssertionError(f"not stopped 30 s after SIGTERM; its log:\n{said}")
    assert code == 0, lines
    stopped = [line for line in lines if "device plugin stopped on" in line]
    assert len(stopped) == 1 and "stopped on SIGTERM" in stopped[0], lines
    assert not (socket_dir / names.DEVICE_PLUGIN_SOCKET_NAME).exists()


def test_bench_allocate_prints_json_last():
    result = CliRunner().invoke(app, ["bench", "allocate", "--json", "--iterations", "30"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert report["iterations"] == 30
    assert 0 < report["allocate_p50_ms"] <= report["allocate_p99_ms"]


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({}, names.KUBELET_POD_RESOURCES_SOCKET),
        ({"BATON_POD_RESOURCES_SOCKET": ""}, None),
        ({"BATON_POD_RESOURCES_SOCKET": "/run/pr.sock"}, "/run/pr.sock"),
    ],
    ids=["unset", "empty", "a-path"],
)
def test_an_empty_pod_resources_socket_env_turns_reconciling_off(
    socket_dir, fake_api, monkeypatch, env, want
):
    """The docs promise `''` = off for the flag and its env twin; click reads an empty env var
    as unset, so `BATON_POD_RESOURCES_SOCKET=''` gave the default socket and reconciled on."""
    import deviceplugin.daemon

    seen = []

    class Recorder:
        def __init__(self, settings, gpus, fake, api_client=None, stop=None):
            seen.append(settings.pod_resources_socket)

        def run_until(self, stop, why):
            pass

    monkeypatch.setattr(deviceplugin.daemon, "Daemon", Recorder)
    base = {
        "NODE_NAME": NODE,
        "BATON_FAKE_GPUS": "1x1024",
        "BATON_DEVICE_PLUGIN_DIR": str(socket_dir),
        "BATON_KUBECONFIG": str(fake_api.kubeconfig_path(socket_dir)),
        "BATON_POD_RESOURCES_SOCKET": None,
    }
    result = CliRunner().invoke(app, ["deviceplugin"], env=base | env)
    assert result.exit_code == 0, result.output
    assert seen == [None if want is None else Path(want)]


def test_a_sigterm_while_it_waits_for_the_pods_at_start_stops_it_there(
    socket_dir, kubelet, fake_api
):
    """The API server does not answer the first list of the node's pods: the start waits for it
    (`SYNC_TIMEOUT_S`). A SIGTERM then went unheeded until the wait ran out, and the plugin
    then served and registered with the kubelet, only to stop."""
    fake_api.hang_next("list", "pods", times=10)
    env = daemon_env(fake_api, socket_dir, socket_dir, "1x1024")
    proc = subprocess.Popen([*BATON, "deviceplugin"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        fake_api.wait_for_requests("list", "pods", timeout=30)  # it waits for the answer now
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=SYNC_TIMEOUT_S / 2)
    finally:
        proc.kill()
        _, said = proc.communicate(timeout=10)
        fake_api.release_hangs()
    assert code == 0, said
    assert said.splitlines()[-1].endswith(
        "device plugin stopped on SIGTERM; the kubelet drops its registration on its own"
    ), said
    assert "serving" not in said and "Traceback" not in said, said
    assert not kubelet.registrations, "registered after the SIGTERM"
    assert not (socket_dir / names.DEVICE_PLUGIN_SOCKET_NAME).exists(), "its socket left behind"

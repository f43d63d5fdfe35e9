"""Every daemon refuses a flag value it cannot use before it starts anything: exit status 2 and
a line naming the flag and the problem, never a traceback."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest
from typer.testing import CliRunner

from commands.cli import app
from commands.cli.agent import FINITE

AGENT = ["agent", "--http-port", "0"]
COORDINATOR = ["coordinator", "--token-file"]  # the token file's path comes next

REFUSED = [
    (["--log-level", "chatty"], "--log-level", "choose one of DEBUG"),
    (["--socket-mode", "999"], "--socket-mode", "no octal file mode"),
    (["--socket-mode", "rw"], "--socket-mode", "no octal file mode"),
    (["--http-port", "99999"], "--http-port", "65535"),
    (["--debug-tcp-port", "70000"], "--debug-tcp-port", "65535"),
    (["--max-hold", "-5"], "--max-hold", "must be above 0"),
    (["--max-hold", "nan"], "--max-hold", "nan: must be above 0"),
    (["--slowest-copy-gbps", "nan"], "--slowest-copy-gbps", "nan: must be above 0"),
    (["--move-timeout", "0"], "--move-timeout", "must be above 0"),
    (["--fake-scale", "0"], "--fake-scale", "must be above 0"),
    (["--backend", "cuda", "--move-timeout", "5e6"], "--move-timeout", "at most 4294967 s"),
    (["--headroom", "-1"], "--headroom", "greater than or equal to 0"),
    (["--reconnect-grace", "-1"], "--reconnect-grace", "greater than or equal to 0"),
    (["--shutdown-grace", "inf"], "--shutdown-grace", "must be a finite number"),
    (["--shutdown-grace", "nan"], "--shutdown-grace", "greater than or equal to 0"),
    (["--forget-departed-after", "-1"], "--forget-departed-after", "greater than or equal to 0"),
    (["--fair-credit", "-1"], "Invalid value for --fair-credit: -1.0 cannot be", "negative"),
    (["--fair-min-share", "0.7"], "for --fair-min-share: 0.7 is outside", "0-0.5"),
    (["--fair-anticipate", "-1"], "for --fair-anticipate: -1.0 cannot be", "negative"),
    (["--llmd-listen", "foo"], "--llmd-listen", "not HOST:PORT"),
    (["--llmd-listen", ":50051"], "--llmd-listen", "':50051' names no host: pass 0.0.0.0:50051"),
    (["--coordination-listen", "127.0.0.1:99999"], "--coordination-listen", "not HOST:PORT"),
    (["--socket", ""], "--socket", "'' names no socket file: pass its path"),  # was a traceback
    (["--socket", "/"], "--socket", "'/' names no socket file: pass its path"),
    (["--socket", "."], "--socket", "'.' names no socket file: pass its path"),
    (["--state-dir", ""], "--state-dir", "'' names no directory: pass its path"),  # was cwd
    (["--fake-dir", ""], "--fake-dir", "'' names no directory: pass its path"),  # was cwd
]


INFINITE = [
    ([f"--{name.replace('_', '-')}", "inf"], f"--{name.replace('_', '-')}", "inf: must be a finite")
    for name in FINITE
]
"""Every number of seconds, rate or scale the agent takes: infinity means nothing it can do (a
timeout that never passes, a turn never revoked, a GPU kept for ever for an owed tenant)."""


def _refusal(args: list[str], env: Mapping[str, str | None] | None = None) -> str:
    """The command's one complaint, its box and line breaks undone; it must exit with 2."""
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # no traceback
    return " ".join(result.output.replace("│", " ").split())


@pytest.mark.parametrize(("flags", "flag", "problem"), REFUSED + INFINITE, ids=lambda v: str(v))
def test_the_agent_refuses_a_bad_value_naming_its_flag(
    flags: list[str], flag: str, problem: str, tmp_path: Path
) -> None:
    where = ["--socket", str(tmp_path / "a.sock"), "--state-dir", str(tmp_path / "state")]
    said = _refusal([*AGENT, *where, *flags])
    assert flag in said and problem in said


def test_the_agent_refuses_a_fake_dir_it_cannot_use(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    where = ["--socket", str(tmp_path / "a.sock"), "--state-dir", str(tmp_path / "state")]
    said = _refusal([*AGENT, *where, "--backend", "fake", "--fake-dir", str(blocker / "gpus")])
    assert f"--fake-dir {blocker / 'gpus'}" in said and "Not a directory" in said


KUBECONFIG = {
    "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
    "users": [{"name": "u", "user": {"token": "t"}}],
    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
    "current-context": "x",
}


@pytest.mark.timeout(30)  # refused: nothing runs (accepted, the agent serves till stopped)
@pytest.mark.parametrize("name", ["GPU-Node-1", "gpu_node_1", "n1."])
def test_the_agent_refuses_a_node_name_no_node_can_have(name: str, tmp_path: Path) -> None:
    """As the device plugin does: the agent took a name with capitals (a host name as given,
    which the kubelet lower-cases) and watched the pods of a node that cannot exist, refusing
    every tenant's Register as in no pod of this node, its log saying only that none came."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps(KUBECONFIG))
    where = ["--socket", str(tmp_path / "a.sock"), "--state-dir", str(tmp_path / "state")]
    node = ["--node-name", name, "--kubeconfig", str(kubeconfig)]
    said = _refusal([*AGENT, *where, *node])
    assert f"Invalid value: --node-name: node {name!r} is not a Kubernetes name" in said


@pytest.mark.parametrize(
    "args",
    [
        ["extender", "--port", "99999"],
        ["deviceplugin", "--node-name", "n", "--metrics-port", "70000"],
        ["dra", "--node-name", "n", "--metrics-port", "-1"],
    ],
    ids=lambda v: v[0],
)
def test_the_other_daemons_refuse_a_port_out_of_range(args: list[str]) -> None:
    said = _refusal(args)
    assert args[-2] in said and "Invalid value" in said


@pytest.mark.parametrize("command", ["deviceplugin", "dra"])
@pytest.mark.parametrize("slots", ["0", "1025", "99999999999"])
def test_the_node_daemons_refuse_slots_per_gpu_out_of_range(command: str, slots: str) -> None:
    """99999999999 slots made the device plugin build a device list it never finished, deaf to
    SIGTERM, saying nothing; past about 8,900 on 8 GPUs the list passes the kubelet's 4 MiB."""
    said = _refusal([command, "--node-name", "n", "--slots-per-gpu", slots])
    bound = "greater than or equal to 1" if slots == "0" else "less than or equal to 1024"
    assert "Invalid value for '--slots-per-gpu'" in said and f"Input should be {bound}" in said


def test_the_device_plugin_refuses_an_empty_device_plugin_dir() -> None:
    """'' served the plugin's socket in the current directory, registering with a kubelet.sock
    there that never comes."""
    said = _refusal(["deviceplugin", "--node-name", "n", "--device-plugin-dir", ""])
    assert "--device-plugin-dir (BATON_DEVICE_PLUGIN_DIR): '' names no directory" in said


def test_the_device_plugin_refuses_a_reconcile_interval_that_never_passes() -> None:
    said = _refusal(["deviceplugin", "--node-name", "n", "--reconcile-interval", "inf"])
    assert "Invalid value for --reconcile-interval: inf: must be a finite number" in said


@pytest.mark.parametrize("grace", ["-1", "nan", "inf", "-inf"])
@pytest.mark.parametrize(
    "command", [["extender"], ["deviceplugin", "--node-name", "n"], ["dra", "--node-name", "n"]]
)
def test_the_other_daemons_refuse_a_shutdown_grace_of_no_seconds(
    command: list[str], grace: str
) -> None:
    """A negative, NaN or infinite grace is refused before anything starts (a stop would wait
    for ever, or for nothing)."""
    said = _refusal([*command, "--shutdown-grace", grace])
    assert f"Invalid value for --shutdown-grace: {float(grace)}: must be a finite" in said


@pytest.mark.parametrize("command", ["extender", "deviceplugin", "dra", "coordinator"])
def test_every_daemon_refuses_an_unknown_log_level(command: str, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t" * 32)
    args = {"coordinator": [*COORDINATOR, str(token)]}.get(command, [command])
    env = {"BATON_LOG_LEVEL": "chatty", "NODE_NAME": "n", "BATON_FAKE_GPUS": "1x1024"}
    said = _refusal(args, env)
    assert "--log-level (BATON_LOG_LEVEL)" in said and "'chatty'" in said


@pytest.mark.parametrize(
    ("flags", "flag", "problem"),
    [
        (["--http-listen", "127.0.0.1:99999"], "--http-listen", "not HOST:PORT"),
        (["--llmd-listen", "nowhere"], "--llmd-listen", "not HOST:PORT"),
        (["--llmd-listen", ":50051"], "--llmd-listen", "names no host: pass 0.0.0.0:50051"),
    ],
)
def test_the_coordinator_refuses_a_bad_address(
    flags: list[str], flag: str, problem: str, tmp_path: Path
) -> None:
    """An address gRPC cannot listen on (`:50051`, no host) is refused before the start, which
    would fail naming no reason ('cannot listen on :50051 (gRPC could not bind it)')."""
    token = tmp_path / "token"
    token.write_text("t" * 32)
    said = _refusal([*COORDINATOR, str(token), *flags])
    assert f"Invalid value for {flag}" in said and problem in said


@pytest.mark.parametrize(
    ("flags", "flag", "problem"),
    [
        (["--retry-period", "0"], "--retry-period", "must be > 0 and < --renew-deadline / 1.2"),
        (["--retry-period", "10"], "--retry-period", "must be > 0 and < --renew-deadline / 1.2"),
        (
            ["--retry-period", "9.9", "--renew-deadline", "10"],
            "--retry-period",
            "must be > 0 and < --renew-deadline / 1.2 (8.333), not 9.9",
        ),
        (["--renew-deadline", "20"], "--renew-deadline", "must be > 0 and < --lease-duration (15)"),
        (["--lease-duration", "0"], "--lease-duration", "must be a whole number >= 1, not 0"),
        (["--prepare-timeout", "0"], "--prepare-timeout", "0.0: must be a finite number"),
        (["--prepare-timeout", "nan"], "--prepare-timeout", "nan: must be a finite number"),
        (["--prepare-timeout", "inf"], "--prepare-timeout", "inf: must be a finite number"),
    ],
)
def test_the_coordinator_names_the_timing_at_fault(
    flags: list[str], flag: str, problem: str, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("t" * 32)
    said = _refusal([*COORDINATOR, str(token), *flags])
    assert f"Invalid value for {flag}: {problem}" in said


def test_the_coordinator_names_the_token_file_it_cannot_read(tmp_path: Path) -> None:
    said = _refusal([*COORDINATOR, str(tmp_path / "missing")])
    assert "Invalid value for --token-file: cannot read" in said


def test_the_coordinator_refuses_a_pod_namespace_without_the_pods_name(tmp_path: Path) -> None:
    """With its pod's namespace and no name, the leader would label no pod (the Service would
    route to no replica, said nowhere): refused before it starts."""
    token = tmp_path / "token"
    token.write_text("t" * 32)
    args = [*COORDINATOR, str(token), "--pod-namespace", "baton-system"]
    said = _refusal(args, env={"POD_NAME": None, "POD_NAMESPACE": None})
    assert "Invalid value for --pod-namespace: 'baton-system' names the pod's namespace" in said
    assert "--identity (POD_NAME)" in said


@pytest.mark.parametrize(
    ("flags", "flag", "problem"),
    [
        (
            ["--namespace", "Baton_System"],
            "--namespace",
            "namespace 'Baton_System' is not a Kubernetes name",
        ),
        (
            ["--namespace", "baton.system"],
            "--namespace",
            "namespace 'baton.system' is not a Kubernetes name",
        ),
        (["--namespace", ""], "--namespace", "namespace '' is not a Kubernetes name"),
        (["--namespace", "n" * 64], "--namespace", "at most 63 characters"),
        (["--lease", "Coordinator"], "--lease", "Lease 'Coordinator' is not a Kubernetes name"),
        (["--lease", "a_b"], "--lease", "Lease 'a_b' is not a Kubernetes name"),
        (["--lease", "l" * 254], "--lease", "at most 253 characters"),
        (
            ["--pod-namespace", "Ns", "--identity", "p-0"],
            "--pod-namespace",
            "namespace 'Ns' is not a",
        ),
        (
            ["--pod-namespace", "ns", "--identity", "P_0"],
            "--identity",
            "pod 'P_0' is not a Kubernetes name",
        ),
    ],
    ids=lambda v: str(v)[:40],
)
def test_the_coordinator_refuses_a_name_no_object_can_have(
    flags: list[str], flag: str, problem: str, tmp_path: Path
) -> None:
    """Taken, it campaigned for a Lease the API server refuses at every try (`Bad_NS/My_Lease`),
    never leading, its log saying only that leader election failed."""
    token = tmp_path / "token"
    token.write_text("t" * 32)
    env = {"BATON_KUBECONFIG": str(tmp_path / "missing")}  # nothing can start
    said = _refusal([*COORDINATOR, str(token), *flags], env=env)
    assert f"Invalid value for {flag} (" in said and problem in said, said


DEMO_REFUSED = [
    (["--footprints", "100,200", "--tenants", "3"], "--footprints '100,200'", "one per tenant (3)"),
    (["--pcie-gbps", "-1"], "--pcie-gbps -1", "give GB/s"),
    (["--scale", "0"], "--scale 0", "above 0"),
    (["--duration", "inf"], "--duration inf", "finite number of seconds"),
    (["--warmup", "inf"], "--warmup inf", "finite number of seconds"),
]


@pytest.mark.timeout(30)  # refused: nothing runs (accepted, a run would go on, or forever)
@pytest.mark.parametrize("command", [["demo"], ["bench", "duty"]], ids=" ".join)
@pytest.mark.parametrize(("flags", "flag", "problem"), DEMO_REFUSED, ids=lambda v: str(v))
def test_the_demo_and_bench_duty_refuse_a_bad_value_before_any_run(
    command: list[str], flags: list[str], flag: str, problem: str
) -> None:
    said = _refusal([*command, *flags])
    assert flag in said and problem in said


@pytest.mark.timeout(30)  # refused: nothing runs (accepted, the demo runs, then fails)
@pytest.mark.parametrize(
    ("under", "why"),
    [("", "not a directory"), ("sub", "Not a directory")],
    ids=["file", "under-file"],
)
def test_the_demo_refuses_an_out_dir_it_cannot_write_before_any_run(
    tmp_path: Path, under: str, why: str
) -> None:
    (tmp_path / "file").write_text("")
    out_dir = tmp_path / "file" / under if under else tmp_path / "file"
    flags = ["--out-dir", str(out_dir), "--tenants", "1", "--duration", "1", "--warmup", "0"]
    said = _refusal(["demo", *flags])
    assert f"Invalid value for --out-dir: {out_dir}: the timeline cannot be written there" in said
    assert f"({why})" in said


def test_bench_train_refuses_a_device_it_cannot_train_on() -> None:
    said = _refusal(["bench", "train", "--device", "tpu"])
    assert "--device" in said and "'tpu': cpu, or cuda" in said


@pytest.mark.timeout(30)  # refused: nothing runs (accepted, the run fills /tmp)
@pytest.mark.parametrize("command", [["demo"], ["bench", "duty"]], ids=" ".join)
def test_the_demo_and_bench_duty_refuse_a_scale_whose_bytes_do_not_fit_before_any_run(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two tenants of 64 MiB at --scale 1: 128 MiB of simulated memory in files, and 64 more
    while one is parked, where /tmp has 100 MiB free."""
    import shutil

    usage = shutil.disk_usage("/tmp")
    seen: list[str] = []

    def little(path: str) -> object:
        seen.append(str(path))
        return usage._replace(free=100 * 1024 * 1024)

    monkeypatch.setattr(shutil, "disk_usage", little)
    before = {p.name for p in Path("/tmp").glob("baton-node-*")}
    flags = ["--tenants", "2", "--footprints", "64", "--gpu-memory", "128", "--scale", "1"]
    short = ["--duration", "1", "--warmup", "0"]
    out = ["--out-dir", str(tmp_path)] if command == ["demo"] else []
    result = CliRunner().invoke(app, [*command, *flags, *short, *out])
    assert result.exit_code == 2, result.output
    name = " ".join(["baton", *command])
    assert result.output == (
        f"{name}: --scale 1: the simulated GPUs' memory takes up to 192 MiB under /tmp (every "
        "tenant's footprint at that scale, and the largest once more as it moves) and /tmp has "
        "100 MiB free; give a smaller --scale\n"
    )
    assert seen == ["/tmp"]
    assert {p.name for p in Path("/tmp").glob("baton-node-*")} == before

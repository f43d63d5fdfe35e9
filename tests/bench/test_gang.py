"""`baton bench gang` run small: two nodes' agent processes, a real kube-apiserver, the
coordinator's arbiter in the bench."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from commands.bench.gang import GangSetup
from commands.bench.gang_nodes import GangCluster
from commands.cli import app
from commands.localnode.binaries import find_binaries, search_dirs


def cpus_of(task: Path) -> frozenset[int]:
    """The CPUs a thread of a process may run on."""
    return frozenset(os.sched_getaffinity(int(task.name)))


def test_a_setup_the_bench_cannot_run_names_its_option() -> None:
    for setup, option in (
        (GangSetup(nodes=9), "nodes"),
        (GangSetup(jobs=1), "jobs"),
        (GangSetup(turns=3), "turns"),
        (GangSetup(hold_ms=0), "hold-ms"),
        (GangSetup(hold_ms=math.nan), "hold-ms"),
        (GangSetup(hold_ms=math.inf), "hold-ms"),
        (GangSetup(crossed=1), "crossed"),
    ):
        with pytest.raises(ValueError, match=option):
            setup.check()


@pytest.mark.parametrize("hold", ["nan", "inf", "-1"])
def test_the_command_refuses_a_hold_of_no_milliseconds_before_anything_starts(hold: str) -> None:
    argv = ["bench", "gang", "--hold-ms", hold, "--turns", "4"]
    done = CliRunner().invoke(app, argv, terminal_width=200)
    assert done.exit_code == 2, done.output
    assert f"Invalid value for --hold-ms: hold-ms {hold} must be a number of milliseconds" in (
        done.output
    )


@pytest.mark.timeout(180)
def test_the_bench_reports_every_figure_with_sane_values() -> None:
    if find_binaries() is None:
        where = ", ".join(str(d) for d in search_dirs())
        pytest.skip(f"needs Kubernetes binaries (BATON_KUBE_BIN_DIR, or in {where})")
    argv = [sys.executable, "-m", "baton", "bench", "gang", "--json"]
    argv += ["--nodes", "2", "--turns", "12", "--hold-ms", "5", "--crossed", "20"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=170, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["jobs"] == 2 and figures["nodes"] == 2
    assert figures["deadlocks"] == 0 and figures["crossed_turns"] == 20
    assert 0 < figures["handoff_p50_ms"] <= figures["handoff_p99_ms"]
    assert 0 < figures["reference_handoff_p50_ms"] <= figures["reference_handoff_p99_ms"]
    assert 0 <= figures["skew_p50_ms"] <= figures["skew_p99_ms"]
    assert figures["skew_samples"] > 0
    assert 0 < figures["efficiency"] <= 1
    assert 0 < figures["reference_efficiency"] <= 1  # the same parks on one node's agent
    assert figures["reference_parked_handoff_p50_ms"] > 0
    assert figures["parks"] > 0 and figures["restores"] > 0  # the parks were forced
    for target in ("handoff", "skew", "efficiency", "deadlock"):
        assert isinstance(figures[f"meets_{target}_target"], bool)
    cpus = sorted(os.sched_getaffinity(0))
    assert figures["agent_cpus"] == [cpus[0], cpus[1 % len(cpus)]]  # node i's on CPU i


@pytest.mark.timeout(120)
def test_an_agent_whose_port_was_taken_before_it_bound_starts_on_other_ports(tmp_path) -> None:
    if find_binaries() is None:
        pytest.skip("needs Kubernetes binaries (BATON_KUBE_BIN_DIR)")
    cluster = GangCluster(tmp_path, 2)
    first = cluster.nodes[0]
    drawn = first.port
    with socket.socket() as squatter:  # binds it between the draw and the agent's start
        squatter.bind(("127.0.0.1", drawn))
        squatter.listen()
        with cluster.running():
            assert first.port != drawn
            assert first.tenants() == set()  # its agent answers on the ports it got
            # Started again, it is on its node's CPU all the same, and so are its threads.
            assert first.cpu is not None
            tasks = Path(f"/proc/{first.process.pid}/task")
            assert {cpus_of(t) for t in tasks.iterdir()} == {frozenset({first.cpu})}
    assert "address already in use" in (tmp_path / first.name / "agent.log").read_text()

"""`baton dra` as a process told to stop while its start still reads the node."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from baton.contract.draapi import REQUEST_TIMEOUT_S
from tests.harness.fakeapi import FakeApiServer

BATON = [sys.executable, "-c", "from commands.cli import main; main()"]


def test_a_sigterm_while_the_start_reads_the_node_stops_it_after_that_one_read(
    tmp_path: Path, fake_api: FakeApiServer
) -> None:
    """An API server that does not answer: the client retried the start's node read three
    times (four request timeouts, 40 s) with the SIGTERM unheeded, then the driver served and
    registered with the kubelet, and stopping took 15 s more: past the pod's grace."""
    fake_api.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}})
    fake_api.hang_next("get", "nodes", times=10)
    env = os.environ | {
        "NODE_NAME": "n",
        "BATON_FAKE_GPUS": "1x1024",
        "BATON_KUBECONFIG": str(fake_api.kubeconfig_path(tmp_path)),
        "BATON_DRA_METRICS_PORT": "0",
        **{
            f"BATON_{name}": str(tmp_path / name.lower())
            for name in ("DRA_PLUGINS_DIR", "DRA_REGISTRY_DIR", "CDI_DIR", "DRA_STATE_DIR")
        },
    }
    proc = subprocess.Popen([*BATON, "dra"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        fake_api.wait_for_requests("get", "nodes", timeout=30)  # its start waits for the answer
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=REQUEST_TIMEOUT_S + 5)
    finally:
        proc.kill()
        _, said = proc.communicate(timeout=10)
        fake_api.release_hangs()
    assert code == 0, said
    assert said.splitlines()[-1].endswith("DRA driver stopped on SIGTERM"), said
    assert "serving" not in said and "Traceback" not in said, said
    assert not (tmp_path / "dra_plugins_dir").exists(), "served after the SIGTERM"
    assert not (tmp_path / "dra_registry_dir").exists(), "registered after the SIGTERM"
    assert len(fake_api.requests("get", "nodes")) == 1, "the node read was retried"

"""`baton extender` from the command line: flag checks, and a full run against the fake API."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import httpx
import pytest
from typer.testing import CliRunner

import baton.cli
from baton.names import ANNOTATION_ASSIGNED_GPUS
from tests.extender.builders import node, pod
from tests.harness.fakeapi import FakeApiServer

START_TIMEOUT_S = 30.0


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--policy", "random"], {}, "'random'; choose one of binpack, spread, complement"),
        ([], {"BATON_EXTENDER_POLICY": "random"}, "choose one of binpack"),
        (["--max-duty", "0"], {}, "0.0 is not a percentage above 0"),
        (["--memory-headroom", "-1"], {}, "must be 0 or more MiB"),
        (["--tls-cert", "/x.crt"], {}, "give both --tls-cert and --tls-key"),
        (["--kubeconfig", "/nonexistent/kubeconfig"], {}, "does not exist"),
    ],
)
def test_bad_flags_are_refused_with_a_reason(
    args: list[str], env: dict[str, str], message: str
) -> None:
    result = CliRunner().invoke(baton.cli.app, ["extender", *args], env=env)
    assert result.exit_code == 2
    assert message in re.sub(r"\s+", " ", result.output.replace("│", " "))


@contextlib.contextmanager
def running_extender(fake_api: FakeApiServer, tmp_path: Path) -> Iterator[int]:
    """`baton extender` on an ephemeral port, configured through env twins; yields the port."""
    kubeconfig = fake_api.kubeconfig_path(tmp_path)
    env = {**os.environ, "BATON_KUBECONFIG": str(kubeconfig), "BATON_EXTENDER_PORT": "0"}
    command = [str(Path(sys.executable).parent / "baton"), "extender", "--host", "127.0.0.1"]
    proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    try:
        yield _port_from_log(proc.stderr, [])
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _port_from_log(stream: IO[str], lines: list[str]) -> int:
    found: list[int] = []
    done = threading.Event()

    def read() -> None:
        for line in stream:
            lines.append(line)
            match = re.search(r"serving on http://127\.0\.0\.1:(\d+)", line)
            if match and not found:
                found.append(int(match.group(1)))
                done.set()
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(START_TIMEOUT_S) and found, f"no 'serving on' line: {lines}"
    return found[0]


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

"""llm-d's snapshot API on a TCP port, called from another network namespace (as another pod
would): the agent cannot tell who calls, so a cuda Snapshot naming a PID that is not the job's
own is PERMISSION_DENIED and nothing moves."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.parking.setup import ParkingOptions, parse_fake_gpus
from baton._pb import snapshot_agent_pb2 as sa
from tests.agent.server.llmd.llmd_client import SnapshotAgentClient, register_workload
from tests.harness.agent import AgentRunner

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(map(shutil.which, ("ip", "unshare", "nsenter"))),
    reason="needs root, iproute2 and util-linux (unshare, nsenter, veth): the caller runs in "
    "its own network namespace",
)

REPO = Path(__file__).resolve().parents[4]
CALLER = """
import json, sys
import grpc
from baton._pb import snapshot_agent_pb2 as sa
from tests.agent.server.llmd.llmd_client import SnapshotAgentClient
client = SnapshotAgentClient(sys.argv[1])
config = sa.BackendConfig(cuda=sa.CudaBackendConfig())
config.cuda.explicit_target.pids.append(int(sys.argv[2]))
try:
    client.snapshot("engine", "g", config)
    print(json.dumps({"code": "OK", "details": ""}))
except grpc.RpcError as err:
    print(json.dumps({"code": err.code().name, "details": err.details()}))
"""


def run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, timeout=10)


@pytest.fixture
def netns(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A network namespace joined to this one by a veth pair: (the file it is bound on, this
    side's address). Bound on a file of the test's own, not named in /run/netns: `ip netns add`
    there makes /run/netns a mount of its own when it is none yet, over the network namespaces
    containerd's CNI bound in it, which then can never be removed ("device or resource busy")
    while a real node runs pods beside this test."""
    n = os.getpid() % 200 + 20
    bound, outside, inside = tmp_path / "netns", f"bvh{n}", f"bvc{n}"
    host, peer = f"10.213.{n}.1", f"10.213.{n}.2"
    bound.touch()
    try:
        run("unshare", f"--net={bound}", "true")
        run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        run("ip", "link", "set", inside, "netns", str(bound))
        run("ip", "addr", "add", f"{host}/30", "dev", outside)
        run("ip", "link", "set", outside, "up")
        for args in (("addr", "add", f"{peer}/30", "dev", inside), ("link", "set", inside, "up")):
            run("nsenter", f"--net={bound}", "ip", *args)
        run("nsenter", f"--net={bound}", "ip", "link", "set", "lo", "up")
        yield str(bound), host
    finally:
        subprocess.run(["ip", "link", "del", outside], capture_output=True, timeout=10)
        subprocess.run(["umount", str(bound)], capture_output=True, timeout=10)


def test_another_namespace_naming_a_pid_not_the_jobs_own_is_denied(
    workdir: str, netns: tuple[str, str]
) -> None:
    bound, host = netns
    gpu = next(iter(parse_fake_gpus("1x1024")))
    runner = AgentRunner(
        workdir,
        parking=ParkingOptions(backend="app", fake_gpus="1x1024"),
        llmd_listen=f"{host}:0",
        llmd_groups=(f"g={gpu}",),
    ).start()
    endpoint = f"{host}:{runner.llmd_port}"
    snapshots: list[object] = []
    workload = register_workload(
        endpoint, "engine", "g", lambda *a: snapshots.append(a), lambda tags: None
    )
    client = SnapshotAgentClient(endpoint)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for _ in range(500):
            if "engine" in {j.job_id for j in client.status().job_statuses}:
                break
            threading.Event().wait(0.01)
        answer = subprocess.run(
            [
                "nsenter",
                f"--net={bound}",
                sys.executable,
                "-c",
                CALLER,
                endpoint,
                str(stranger.pid),
            ],
            capture_output=True,
            text=True,
            timeout=15,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert answer.returncode == 0, answer.stderr
        got = json.loads(answer.stdout)
        assert got["code"] == "PERMISSION_DENIED", got
        assert str(stranger.pid) in got["details"] and "engine" in got["details"], got
        assert snapshots == [], "nothing moved"
        assert sa.JobState.Name(client.status().job_statuses[0].state) == "JOB_STATE_RUNNING"
    finally:
        stranger.kill()
        stranger.wait(10)
        client.close()
        workload.close()
        runner.stop()

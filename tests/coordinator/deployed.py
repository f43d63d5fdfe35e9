"""The coordinator as deployed in the tests against a real API server: `baton coordinator`
processes with a short Lease, and what the tests read from the agents."""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

import grpc

from baton._pb import health_pb2 as hp
from baton._pb import health_pb2_grpc as hp_grpc
from commands.localnode.controlplane import ControlPlane, free_ports
from commands.localnode.procs import Process, wait_for
from tests.coordinator.conftest import LEASE_NS, TEAM
from tests.coordinator.nodes import AgentNode

__all__ = ["LEASE_NS", "TEAM"]


class CoordinatorProcess:
    """`baton coordinator` with a short Lease, serving llm-d's API on a loopback port."""

    def __init__(self, plane: ControlPlane, root: Path, name: str, lease: str) -> None:
        self.port, self.http_port = free_ports(2)
        self.address = f"127.0.0.1:{self.port}"
        self.process = Process(
            name,
            [
                sys.executable, "-m", "baton", "coordinator",
                "--kubeconfig", str(plane.admin_kubeconfig),
                "--token-file", str(root / "token"),
                "--namespace", LEASE_NS,
                "--lease", lease,
                "--identity", name,
                "--llmd-listen", self.address,
                "--http-listen", f"127.0.0.1:{self.http_port}",
                "--lease-duration", "3",
                "--renew-deadline", "2",
                "--retry-period", "0.2",
                "--allow-unidentified",
            ],
            root / f"{name}.log",
        )  # fmt: skip

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.http_port}/v1/status", timeout=10
        ) as r:
            data: dict[str, Any] = json.loads(r.read())
        return data

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/metrics", timeout=10) as r:
            return str(r.read().decode())

    def serving(self) -> bool:
        """Whether it leads (its health service says SERVING)."""
        self.process.check()
        try:
            with grpc.insecure_channel(self.address) as channel:
                answer = hp_grpc.HealthStub(channel).Check(hp.HealthCheckRequest(), timeout=2)
        except grpc.RpcError:
            return False
        return bool(answer.status == hp.HealthCheckResponse.SERVING)


def turns_on(nodes: list[AgentNode]) -> dict[str, list[tuple[str, str, tuple[str, ...]]]]:
    """node → its job turns as (job, state, members): what the agents hold, read from them."""
    return {n.name: [(t.job, t.state, tuple(t.members)) for t in n.report().turns] for n in nodes}


def members_known(nodes: list[AgentNode], pods: dict[str, set[str]]) -> None:
    for node in nodes:
        wanted = pods[node.name]

        def seen(node: AgentNode = node, wanted: set[str] = wanted) -> bool | None:
            return True if wanted <= node.tenants() else None

        wait_for(f"agent of {node.name} seeing pods {sorted(wanted)}", seen, 30)


def start_pair(plane: ControlPlane, root: Path, lease: str) -> list[CoordinatorProcess]:
    pair = [CoordinatorProcess(plane, root, f"{lease}-{x}", lease) for x in "ab"]
    for each in pair:
        each.process.start()
    return pair


def leader_of(pair: list[CoordinatorProcess]) -> CoordinatorProcess:
    def one() -> CoordinatorProcess | None:
        serving = [c for c in pair if c.process.running() and c.serving()]
        return serving[0] if len(serving) == 1 else None

    return wait_for("one coordinator leading", one, 30)


def holders_of(node: AgentNode) -> dict[str, str]:
    return {g: v["holder"] for g, v in node.status()["gpus"].items() if v["holder"]}


def queued(nodes: list[AgentNode], pods: set[str]) -> bool:
    """Whether every one of `pods` waits in its agent's queue (its job's prepare is there)."""
    waiting = {
        w["tenant_id"]
        for node in nodes
        for gpu in node.status()["gpus"].values()
        for w in gpu["queue"]
    }
    return pods <= waiting


def settle(
    nodes: list[AgentNode], expected: dict[str, list[tuple[str, str, tuple[str, ...]]]]
) -> None:
    """Wait (bounded) until the agents hold exactly `expected` (commits go out after the waiter
    is told, so a node may still say "prepared" for a moment)."""
    seen: list[object] = []

    def now() -> bool | None:
        seen[:] = [turns_on(nodes)]
        return True if seen[0] == expected else None

    try:
        wait_for("the agents' job turns settling", now, 10)
    except Exception as err:
        raise AssertionError(f"the agents hold {seen[0]}, not {expected}") from err

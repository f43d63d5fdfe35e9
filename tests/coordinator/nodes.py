"""Nodes for the coordinator's tests against a real API server: each a Node object and a
`baton agent` process of its own (its node name, socket, state and job-turn port), with pods
bound to it through the API. No kubelet: the pods stay Pending, which is all an agent needs
to take them for tenants (their GPUs come from Baton's annotations).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from baton._pb import jobturns_pb2 as jt
from baton.contract.annotations import GpuRecord, encode_gpus
from baton.contract.names import (
    ANNOTATION_AGENT_COORDINATION,
    ANNOTATION_ASSIGNED_GPUS,
    ANNOTATION_GPUS,
    LABEL_JOB,
    LABEL_LLMD_GROUP,
)
from commands.localnode.controlplane import ControlPlane, free_ports
from commands.localnode.procs import Process, wait_for
from coordinator.agents import AgentLinks

TOKEN = "cluster-test-token"
START_S = 30.0


class AgentNode:
    """One node: its Node object and its agent process."""

    def __init__(self, plane: ControlPlane, root: Path, name: str, gpus: int = 1) -> None:
        self.plane = plane
        self.name = name
        self.gpus = tuple(f"GPU-{name}-{i}" for i in range(gpus))
        self.root = root / name
        self.port, self.http_port = free_ports(2)
        self.address = f"127.0.0.1:{self.port}"
        token = root / "token"
        token.write_text(TOKEN)
        self.process = Process(
            f"agent-{name}",
            [
                sys.executable, "-m", "baton", "agent",
                "--node-name", name,
                "--kubeconfig", str(plane.admin_kubeconfig),
                "--socket", f"{self.root}/agent.sock",
                "--state-dir", f"{self.root}/state",
                "--http-host", "127.0.0.1",
                "--http-port", str(self.http_port),
                "--coordination-listen", self.address,
                "--coordination-token-file", str(token),
                "--reconnect-grace", "2",
            ],
            self.root / "agent.log",
        )  # fmt: skip

    def create(self, core: Any) -> AgentNode:
        records = [GpuRecord(uuid, i, "fake", 81920, 4) for i, uuid in enumerate(self.gpus)]
        body = {
            "metadata": {"name": self.name, "annotations": {ANNOTATION_GPUS: encode_gpus(records)}}
        }
        core.create_node(body)
        return self

    def start(self, core: Any) -> AgentNode:
        """Start the agent; back once it has put its address on its node."""
        self.process.start()

        def annotated() -> bool | None:
            self.process.check()
            node = core.read_node(self.name)
            found = (node.metadata.annotations or {}).get(ANNOTATION_AGENT_COORDINATION)
            return True if found == self.address else None

        wait_for(f"agent of {self.name} annotating its node", annotated, START_S)
        return self

    def stop(self) -> None:
        self.process.stop()

    def status(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.http_port}/v1/status"
        with urllib.request.urlopen(url, timeout=10) as answer:
            data: dict[str, Any] = json.loads(answer.read())
        return data

    def tenants(self) -> set[str]:
        """The agent's tenants (none while its status server is not up yet)."""
        self.process.check()
        try:
            return set(self.status().get("tenants", {}))
        except OSError:  # URLError, connection refused: it is still starting
            return set()

    def report(self, epoch: int = 0) -> jt.ReportResponse:
        """The agent's job turns (`epoch` 0 only reads: it raises no fence)."""
        answer: jt.ReportResponse = self._call(
            lambda links: links.report(self.name, self.address, epoch)
        )
        return answer

    def prepare(
        self, epoch: int, turn_id: str, namespace: str, job: str, nodes: Sequence[str] = ()
    ) -> None:
        """Prepare a job turn on this node as a leader of `epoch` would (`nodes`: every node of
        the turn, as its Prepare names them)."""
        turn = (turn_id, namespace, job, "")
        self._call(lambda links: links.prepare(self.name, self.address, epoch, turn, (), 10, nodes))

    def hold(
        self, epoch: int, turn_id: str, namespace: str, job: str, nodes: Sequence[str] = ()
    ) -> None:
        """Prepare and commit a job turn on this node, as a leader of `epoch` would."""
        self.prepare(epoch, turn_id, namespace, job, nodes)
        self._call(lambda links: links.commit(self.name, self.address, epoch, turn_id))

    def release(self, epoch: int, turn_id: str) -> bool:
        """Release a job turn as a leader of `epoch` would (`NodeFailed` if refused)."""
        released: bool = self._call(
            lambda links: links.release(self.name, self.address, epoch, turn_id, "test")
        )
        return released

    def _call(self, call: Callable[[AgentLinks], Awaitable[Any]]) -> Any:
        """One call on a connection of its own, as the coordinator makes them."""

        async def once() -> Any:
            links = AgentLinks(TOKEN)
            try:
                return await call(links)
            finally:
                await links.close()

        return asyncio.run(once())


def job_pod(
    core: Any,
    namespace: str,
    name: str,
    node: AgentNode,
    job: str,
    group: str = "",
    gpus: Sequence[str] = (),
) -> None:
    """A pod of `job` bound to `node`, on `gpus` (default: all the node's GPUs)."""
    labels = {LABEL_JOB: job, **({LABEL_LLMD_GROUP: group} if group else {})}
    body = {
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {ANNOTATION_ASSIGNED_GPUS: ",".join(gpus or node.gpus)},
        },
        "spec": {
            "nodeName": node.name,
            "containers": [{"name": "main", "image": "registry.invalid/tenant:1"}],
        },
    }
    core.create_namespaced_pod(namespace, body)


@contextmanager
def agent_nodes(
    plane: ControlPlane, root: Path, names: list[str], gpus: int = 1
) -> Iterator[list[AgentNode]]:
    """Nodes with running agents (`gpus` each); every agent stopped and every node deleted
    after."""
    from kubernetes import client

    from baton.contract.kube import load_api_client

    core = client.CoreV1Api(load_api_client(str(plane.admin_kubeconfig)))
    nodes = [AgentNode(plane, root, name, gpus) for name in names]
    try:
        for node in nodes:
            node.create(core).start(core)
        yield nodes
    finally:
        for node in nodes:
            node.stop()
            with contextlib.suppress(Exception):  # never created
                core.delete_node(node.name)

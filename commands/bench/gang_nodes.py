"""The cluster of `baton bench gang`: a real kube-apiserver (and etcd), one `baton agent`
process per node on loopback with the fake backend and a simulated GPU of its own, job pods
bound to the nodes through the API, and the coordinator's own watches feeding its cluster view.

No kubelet: the pods stay Pending, which is all an agent needs to take them for tenants (their
GPUs come from Baton's annotations). Every process is stopped when the block ends, also on
failure; every wait is bounded.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from baton.contract.annotations import GpuRecord, encode_gpus
from baton.contract.kube import Outage, load_api_client
from baton.contract.names import (
    ANNOTATION_AGENT_COORDINATION,
    ANNOTATION_ASSIGNED_GPUS,
    ANNOTATION_GPUS,
    LABEL_JOB,
    RESOURCE_GPU,
    RESOURCE_GPU_MEMORY,
    fake_gpu_uuid,
)
from baton.contract.reflector import KubeSource, Reflector
from commands.bench.fleet import make_namespace
from commands.localnode.controlplane import ControlPlane, free_ports
from commands.localnode.procs import LocalNodeError, Process, wait_for
from coordinator.cluster import ClusterView, NodeStore, PlanError, PodStore

log = logging.getLogger(__name__)

NAMESPACE = "baton-bench-gang"
TOKEN = "baton-bench-gang-token"
GPU_MIB = 1024
"""Each node's one simulated GPU."""
PORT_ATTEMPTS = 3
"""How many port pairs an agent is started on before its start fails."""
START_S = 90.0
"""How long the agents may take to start and to see their pods (2 vCPUs, 8 agents)."""


class GangNode:
    """One node: its Node object, its agent process and that agent's simulated GPU."""

    def __init__(
        self,
        root: Path,
        kubeconfig: Path,
        name: str,
        ports: tuple[int, int],
        cpu: int | None = None,
    ) -> None:
        self.name = name
        self.cpu = cpu
        """The CPU of this machine the node's agent runs on (None: any)."""
        self.gpu = fake_gpu_uuid(0, name)
        self.root, self.kubeconfig = root, kubeconfig
        self.dir = root / name
        self.fake_dir = self.dir / "fakegpu"
        self.socket = str(self.dir / "agent.sock")
        self.listen_on(ports)

    def listen_on(self, ports: tuple[int, int]) -> None:
        """The job-turn and HTTP ports its agent (started after this) listens on."""
        self.port, self.http_port = ports
        self.address = f"127.0.0.1:{self.port}"
        self.process = Process(
            f"agent-{self.name}",
            [
                sys.executable, "-m", "baton", "agent",
                "--node-name", self.name,
                "--kubeconfig", str(self.kubeconfig),
                "--socket", self.socket,
                "--state-dir", str(self.dir / "state"),
                "--http-host", "127.0.0.1",
                "--http-port", str(self.http_port),
                "--coordination-listen", self.address,
                "--coordination-token-file", str(self.root / "token"),
                "--backend", "fake",
                "--fake-gpus", str(GPU_MIB),
                "--fake-dir", str(self.fake_dir),
                "--allow-local-tenants",
                "--log-level", "WARNING",
            ],
            self.dir / "agent.log",
        )  # fmt: skip

    def start(self) -> None:
        """Start the node's agent, on its CPU: a node's agent has that node's CPUs, and its
        event loop and its worker thread wake each other there, not across this machine's."""
        self.process.start()
        if self.cpu is None:
            return
        try:
            os.sched_setaffinity(self.process.pid, {self.cpu})
        except OSError as exc:
            log.warning("the agent of %s runs on any CPU (CPU %d: %s)", self.name, self.cpu, exc)
            self.cpu = None

    def body(self) -> dict[str, Any]:
        """The Node object, its simulated GPU annotated as the device plugin would."""
        record = GpuRecord(self.gpu, 0, "fake", GPU_MIB, 4)
        annotations = {ANNOTATION_GPUS: encode_gpus([record])}
        return {"metadata": {"name": self.name, "annotations": annotations}}

    def _get(self, path: str) -> bytes:
        url = f"http://127.0.0.1:{self.http_port}{path}"
        with urllib.request.urlopen(url, timeout=10) as answer:
            data: bytes = answer.read()
        return data

    def tenants(self) -> set[str]:
        """The agent's tenants (none while its status server is not up yet)."""
        self.process.check()
        try:
            return set(json.loads(self._get("/v1/status")).get("tenants", {}))
        except OSError:  # connection refused: it is still starting
            return set()

    def moves(self) -> dict[str, float]:
        """Parks and restores the agent has made: direction → count (`baton_moves_total`)."""
        found: dict[str, float] = {}
        for line in self._get("/metrics").decode().splitlines():
            if not line.startswith("baton_moves_total{"):
                continue
            labels, _, value = line.rpartition(" ")
            for direction in ("park", "restore"):
                if f'direction="{direction}"' in labels:
                    found[direction] = found.get(direction, 0.0) + float(value)
        return found


class GangCluster:
    """The control plane, the nodes' agents, the job pods and the coordinator's view."""

    def __init__(self, root: Path, nodes: int, pin: bool = True) -> None:
        """`pin`: node i's agent on CPU i (modulo the CPUs this process may use), the rest of
        the cluster (the API server, the coordinator) on any."""
        self.root = root
        self.plane = ControlPlane(
            root / "plane", controller_manager=False, scheduler=False, ports="free"
        )
        ports = free_ports(2 * nodes)
        cpus = sorted(os.sched_getaffinity(0))
        self.nodes = [
            GangNode(
                root,
                self.plane.admin_kubeconfig,
                f"gang-{i}",
                (ports[2 * i], ports[2 * i + 1]),
                cpus[i % len(cpus)] if pin else None,
            )
            for i in range(nodes)
        ]
        self.view = ClusterView()
        self.core: Any = None
        self._reflectors: list[Reflector] = []

    @contextmanager
    def running(self) -> Iterator[GangCluster]:
        """Everything up for the block; everything stopped after it, also on failure."""
        from kubernetes import client

        (self.root / "token").write_text(TOKEN)
        try:
            self.plane.start()
            api = load_api_client(str(self.plane.admin_kubeconfig))
            self.core = client.CoreV1Api(api)
            make_namespace(self.core, NAMESPACE)
            for node in self.nodes:
                self.core.create_node(node.body())
                node.start()
            for node in self.nodes:
                self._started(node)
            self._watch(api)
            yield self
        finally:
            for reflector in self._reflectors:
                reflector.stop(5)
            for node in self.nodes:
                node.process.stop()
            self.plane.close()

    def _started(self, node: GangNode) -> None:
        """Wait for the node's agent; on other ports if one of its own was taken meanwhile (they
        were free when drawn, and something bound one before the agent did)."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                wait_for(
                    f"agent of {node.name} annotating its node", self._annotated(node), START_S
                )
                return
            except LocalNodeError as exc:
                if "address already in use" not in str(exc) or attempt == PORT_ATTEMPTS:
                    raise
            log.warning("agent of %s found a port of its taken; on other ports", node.name)
            port, http_port = free_ports(2)
            node.listen_on((port, http_port))
            node.start()

    def _annotated(self, node: GangNode) -> Any:
        def probe() -> bool | None:
            node.process.check()
            found = self.core.read_node(node.name).metadata.annotations or {}
            return True if found.get(ANNOTATION_AGENT_COORDINATION) == node.address else None

        return probe

    def _watch(self, api: Any) -> None:
        pods = Reflector(
            KubeSource(api, "pods", label_selector=LABEL_JOB),
            PodStore(self.view, LABEL_JOB),
            Outage(log, "watch of job pods", "job membership is not updated"),
            name="gang-pods",
        )
        nodes = Reflector(
            KubeSource(api, "nodes"),
            NodeStore(self.view),
            Outage(log, "watch of nodes", "agents' addresses are not updated"),
            name="gang-nodes",
        )
        self._reflectors += [pods.start(), nodes.start()]

    def add_job(
        self, job: str, nodes: list[GangNode], memory_mib: int | None = None
    ) -> dict[str, str]:
        """One pod of `job` on each of `nodes`, on its GPU (asking `memory_mib` of it, as a pod
        the extender placed by its memory does); node name → the pod's tenant id."""
        pods = {}
        container: dict[str, Any] = {"name": "main", "image": "registry.invalid/trainer:1"}
        if memory_mib is not None:
            limits = {RESOURCE_GPU: "1", RESOURCE_GPU_MEMORY: str(memory_mib)}
            container["resources"] = {"limits": limits}
        for node in nodes:
            name = f"{job}-{node.name}"
            body = {
                "metadata": {
                    "name": name,
                    "labels": {LABEL_JOB: job},
                    "annotations": {ANNOTATION_ASSIGNED_GPUS: node.gpu},
                },
                "spec": {"nodeName": node.name, "containers": [container]},
            }
            self.core.create_namespaced_pod(NAMESPACE, body)
            pods[node.name] = f"{NAMESPACE}/{name}"
        return pods

    def wait_known(self, jobs: dict[str, dict[str, str]]) -> None:
        """Until every agent has its pods for tenants and the view plans every job whole."""
        by_name = {n.name: n for n in self.nodes}
        for node_name in sorted({n for pods in jobs.values() for n in pods}):
            node = by_name[node_name]
            wanted = {pods[node_name] for pods in jobs.values() if node_name in pods}

            def seen(node: GangNode = node, wanted: set[str] = wanted) -> bool | None:
                return True if wanted <= node.tenants() else None

            wait_for(f"agent of {node_name} seeing pods {sorted(wanted)}", seen, START_S)
        for job, pods in jobs.items():

            def planned(job: str = job, pods: dict[str, str] = pods) -> bool | None:
                with suppress(PlanError):
                    if set(self.view.plan(NAMESPACE, job).pods) == set(pods):
                        return True
                return None

            wait_for(f"the coordinator's view of job {job}", planned, START_S)

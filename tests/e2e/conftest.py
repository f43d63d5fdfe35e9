"""One whole Baton node on loopback, shared by the end-to-end tests of this package."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from baton import names
from tests.e2e.cluster import Container, Kubelet, Placement, Scheduler
from tests.e2e.processes import Daemon, free_port, get_json, get_ok, poll
from tests.e2e.prometheus import Prometheus, binary
from tests.harness.fakeapi import FakeApiServer
from tests.harness.kubelet import KubeletStub

NODE = "node-a"
SPARE_NODE = "node-b"
"""Has GPUs on paper only (no daemons): kube-scheduler has a choice, so it calls prioritize."""
GPU_MIB = 1024
GPU_SIZES_MIB = (300, GPU_MIB)
"""The node's two GPUs: tenants fit only the second, so the extender must choose it, and the
kubelet's default pick (the first free slot, on the first GPU) is right only if
GetPreferredAllocation steers it."""
TENANT_MIB = 400
"""Two tenants fit on a GPU, three do not: someone is parked at every third turn or so."""
BUDGET_MIB = 4096
TENANTS = ("grpo-a", "grpo-b", "grpo-c")
STEPS = 12
FAKE_DIR = "/var/lib/baton-fake-gpus"
"""Host path of the simulated device memory (a hostPath volume of the tenant pods)."""
TENANT_FAKE_DIR = "/run/baton-fake-gpus"


@dataclass
class Node:
    """Everything the end-to-end tests look at."""

    root: Path
    api: FakeApiServer
    kubeconfig: Path
    extender_url: str
    agent_url: str
    agent_port: int
    deviceplugin_url: str
    placements: dict[str, Placement] = field(default_factory=dict)
    containers: dict[str, Container] = field(default_factory=dict)
    outputs: dict[str, tuple[int, str, str]] = field(default_factory=dict)
    agent_status: dict[str, Any] = field(default_factory=dict)
    inventory: dict[str, Any] = field(default_factory=dict)
    status_json: dict[str, Any] = field(default_factory=dict)
    status_table: str = ""
    agent_metrics: str = ""
    kubelet: Kubelet | None = None
    prometheus: Prometheus | None = None
    finished_at: float = 0.0


def node_object(name: str, address: str, annotations: dict[str, str] | None = None) -> Any:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, names.LABEL_GPU_NODE: "true"},
            "annotations": annotations or {},
        },
        "status": {"addresses": [{"type": "InternalIP", "address": address}]},
    }


def spare_node() -> Any:
    """What the device plugin would write on a node with one GPU cut into 8 slots."""
    gpus = [{"uuid": "GPU-spare-0", "index": 0, "model": "fake", "memoryMiB": GPU_MIB}]
    gpus[0].update(slots=8, healthy=True)
    notes = {
        names.ANNOTATION_GPUS: json.dumps(gpus),
        names.ANNOTATION_HOST_MEMORY_BUDGET: str(BUDGET_MIB),
    }
    return node_object(SPARE_NODE, "127.0.0.2", notes)


def tenant_pod(name: str) -> Any:
    """A GRPO tenant as a user writes it: Baton limits, the example loop, simulated memory."""
    env = {
        "GRPO_STEPS": str(STEPS),
        "GRPO_GENERATE_S": "0.04",
        "GRPO_SCORE_S": "0.05",
        "GRPO_TRAIN_S": "0.04",
        "GRPO_GPU_MEMORY_MIB": str(TENANT_MIB),
        names.ENV_FAKE_GPU_DIR: TENANT_FAKE_DIR,
    }
    limits = {
        names.RESOURCE_GPU: "1",
        names.RESOURCE_GPU_MEMORY: str(TENANT_MIB),
        names.RESOURCE_GPU_DUTY: "30",
        "memory": "2Gi",
        "cpu": "1",
    }
    container = {
        "name": "trainer",
        "image": "baton",
        "command": ["python", "-m", "agent.examples.grpo_loop"],
        "args": ["--acquire-timeout", "30"],
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "resources": {"limits": limits, "requests": limits},
        "volumeMounts": [{"name": "fake-gpus", "mountPath": TENANT_FAKE_DIR}],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": str(uuid.uuid4())},
        "spec": {
            "schedulerName": names.SCHEDULER_NAME,
            "containers": [container],
            "volumes": [{"name": "fake-gpus", "hostPath": {"path": FAKE_DIR}}],
        },
        "status": {"phase": "Pending"},
    }


@contextlib.contextmanager
def daemons(root: Path, api: FakeApiServer, kubeconfig: Path) -> Iterator[Node]:
    """The agent, device plugin and extender as `baton` processes, ready."""
    plugin_dir = root / "var/lib/kubelet/device-plugins"
    plugin_dir.mkdir(parents=True)
    (root / "run/baton").mkdir(parents=True)
    (root / FAKE_DIR.lstrip("/")).mkdir(parents=True)
    gpus_file = root / "fake-gpus.json"
    gpus = [
        {"uuid": names.fake_gpu_uuid(i), "memoryMiB": mib} for i, mib in enumerate(GPU_SIZES_MIB)
    ]
    gpus_file.write_text(json.dumps(gpus))
    ports = {name: free_port() for name in ("agent", "deviceplugin", "extender")}
    kubelet = KubeletStub(plugin_dir)
    kubelet.start()
    started = [
        Daemon(
            "agent",
            ["agent", "--socket", str(root / "run/baton/agent.sock"), "--http-host", "127.0.0.1"],
            {
                "NODE_NAME": NODE,
                "BATON_KUBECONFIG": str(kubeconfig),
                "BATON_PROC_ROOT": str(root / "proc"),
                "BATON_AGENT_STATE_DIR": str(root / "var/lib/baton"),
                "BATON_AGENT_HTTP_PORT": str(ports["agent"]),
                names.ENV_AGENT_BACKEND: "fake",
                names.ENV_FAKE_GPUS: ",".join(map(str, GPU_SIZES_MIB)),
                names.ENV_FAKE_SCALE: str(1 / 1024),
                names.ENV_FAKE_GPU_DIR: str(root / FAKE_DIR.lstrip("/")),
                names.ENV_HOST_MEMORY_BUDGET: str(BUDGET_MIB),
            },
        ),
        Daemon(
            "deviceplugin",
            ["deviceplugin", "--fake-gpus", str(gpus_file), "--kubeconfig", str(kubeconfig)],
            {
                "NODE_NAME": NODE,
                "BATON_DEVICE_PLUGIN_DIR": str(plugin_dir),
                "BATON_HOST_MEMORY_BUDGET": str(BUDGET_MIB),
                "BATON_DEVICE_PLUGIN_METRICS_HOST": "127.0.0.1",
                "BATON_DEVICE_PLUGIN_METRICS_PORT": str(ports["deviceplugin"]),
            },
        ),
        Daemon(
            "extender",
            ["extender", "--host", "127.0.0.1", "--port", str(ports["extender"])],
            {"BATON_KUBECONFIG": str(kubeconfig), "BATON_EXTENDER_POLICY": "binpack"},
        ),
    ]
    node = Node(
        root=root,
        api=api,
        kubeconfig=kubeconfig,
        extender_url=f"http://127.0.0.1:{ports['extender']}",
        agent_url=f"http://127.0.0.1:{ports['agent']}",
        agent_port=ports["agent"],
        deviceplugin_url=f"http://127.0.0.1:{ports['deviceplugin']}",
    )
    try:
        started[0].wait_for_line(r"agent ready")
        kubelet.wait_for_registrations(1, timeout=60)
        poll("the extender's readiness", lambda: get_ok(f"{node.extender_url}/readyz"), 60)
        poll("the node's GPUs in the extender's inventory", lambda: _sees_gpus(node), 30)
        node.kubelet = Kubelet(kubelet, api, root, root / "proc")
        yield node
    finally:
        codes = {d.name: d.stop() for d in started}
        kubelet.stop()
        logs = "\n".join(f"--- {d.name}\n{d.log()}" for d in started)
        clean = (0, -signal.SIGTERM)
        assert all(c in clean for c in codes.values()), f"exit codes {codes}\n{logs}"


def _sees_gpus(node: Node) -> bool | None:
    inventory = get_json(f"{node.extender_url}/v1/inventory")
    ours = [n for n in inventory["nodes"] if n["name"] == NODE and n["gpus"]]
    return True if ours else None


def start_prometheus(node: Node) -> None:
    """Scrape the three daemons, when Prometheus is installed."""
    path = binary()
    if path is None:
        return
    targets = {
        "baton-agent": node.agent_url.removeprefix("http://"),
        "baton-deviceplugin": node.deviceplugin_url.removeprefix("http://"),
        "baton-extender": node.extender_url.removeprefix("http://"),
    }
    node.prometheus = Prometheus(path, node.root / "prometheus", targets)
    node.prometheus.wait_ready()


def run_tenants(node: Node) -> None:
    """Schedule, admit and run the tenant pods; snapshot status and inventory while they run."""
    from tests.e2e.status import snapshot, wait_for_tenants

    scheduler = Scheduler(node.extender_url, node.api, [NODE, SPARE_NODE])
    kubelet = node.kubelet
    assert kubelet is not None
    for name in TENANTS:
        node.api.put_object(tenant_pod(name))
        node.placements[name] = scheduler.schedule(name)
        node.containers[name] = kubelet.admit(name)
    wait_for_tenants(node, [f"default/{name}" for name in TENANTS])
    for container in node.containers.values():
        kubelet.release(container)
    snapshot(node)
    for name, container in node.containers.items():
        try:
            out, err = container.proc.communicate(timeout=60)
        except Exception:
            container.proc.kill()
            raise
        node.outputs[name] = (container.proc.returncode, out, err)
        kubelet.finished(container, container.proc.returncode == 0)
    node.finished_at = time.time()
    node.agent_metrics = _text(f"{node.agent_url}/metrics")


def _text(url: str) -> str:
    from tests.e2e.processes import get_text

    return get_text(url)


@pytest.fixture(scope="package")
def node() -> Iterator[Node]:
    root = Path(tempfile.mkdtemp(prefix="e2e-", dir="/tmp"))
    api = FakeApiServer().start()
    try:
        api.put_object(node_object(NODE, "127.0.0.1"))
        api.put_object(spare_node())
        kubeconfig = api.kubeconfig_path(root)
        with daemons(root, api, kubeconfig) as running:
            try:
                start_prometheus(running)
                run_tenants(running)
                yield running
            finally:
                if running.prometheus is not None:
                    running.prometheus.stop()
                for container in running.containers.values():
                    if container.proc.poll() is None:
                        container.proc.kill()
    finally:
        api.stop()
        shutil.rmtree(root, ignore_errors=True)

"""One whole Baton node on loopback, shared by the end-to-end tests of this package."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from baton.contract import names
from tests.e2e.cluster import Kubelet, Scheduler
from tests.e2e.node import (
    BUDGET_MIB,
    FAKE_DIR,
    GPU_SIZES_MIB,
    NODE,
    SPARE_NODE,
    TENANTS,
    Node,
    node_object,
    node_pod,
    spare_node,
    tenant_pod,
)
from tests.e2e.processes import Daemon, free_port, get_json, get_ok, get_text, poll
from tests.e2e.prometheus import Prometheus, binary
from tests.e2e.status import snapshot, wait_for_tenants
from tests.harness.fakeapi import FakeApiServer
from tests.harness.kubelet import KubeletStub


def start_daemons(root: Path, kubeconfig: Path, ports: dict[str, int]) -> list[Daemon]:
    """`baton agent`, `baton deviceplugin`, `baton extender`, configured for the node `root`."""
    plugin_dir = root / "var/lib/kubelet/device-plugins"
    (root / "proc").mkdir(parents=True, exist_ok=True)  # the node's /proc, as the agent expects
    fake_gpus = ",".join(map(str, GPU_SIZES_MIB))  # both name them by NODE_NAME, the same way
    agent_env = {
        "NODE_NAME": NODE,
        "BATON_KUBECONFIG": str(kubeconfig),
        "BATON_PROC_ROOT": str(root / "proc"),
        "BATON_AGENT_STATE_DIR": str(root / "var/lib/baton"),
        "BATON_AGENT_HTTP_PORT": str(ports["agent"]),
        names.ENV_AGENT_BACKEND: "fake",
        names.ENV_FAKE_GPUS: fake_gpus,
        names.ENV_FAKE_SCALE: str(1 / 1024),
        names.ENV_FAKE_GPU_DIR: str(root / FAKE_DIR.lstrip("/")),
        names.ENV_HOST_MEMORY_BUDGET: str(BUDGET_MIB),
    }
    plugin_env = {
        "NODE_NAME": NODE,
        "BATON_DEVICE_PLUGIN_DIR": str(plugin_dir),
        "BATON_HOST_MEMORY_BUDGET": str(BUDGET_MIB),
        "BATON_DEVICE_PLUGIN_METRICS_HOST": "127.0.0.1",
        "BATON_DEVICE_PLUGIN_METRICS_PORT": str(ports["deviceplugin"]),
        "BATON_POD_RESOURCES_SOCKET": str(root / "var/lib/kubelet/pod-resources/kubelet.sock"),
    }
    extender_env = {"BATON_KUBECONFIG": str(kubeconfig), "BATON_EXTENDER_POLICY": "binpack"}
    socket = str(root / "run/baton/agent.sock")
    return [
        Daemon("agent", ["agent", "--socket", socket, "--http-host", "127.0.0.1"], agent_env),
        Daemon(
            "deviceplugin",
            ["deviceplugin", "--fake-gpus", fake_gpus, "--kubeconfig", str(kubeconfig)],
            plugin_env,
        ),
        Daemon(
            "extender",
            ["extender", "--host", "127.0.0.1", "--port", str(ports["extender"])],
            extender_env,
        ),
    ]


@contextlib.contextmanager
def daemons(root: Path, api: FakeApiServer, kubeconfig: Path) -> Iterator[Node]:
    """The kubelet stub and the three daemons, each ready; stopped (cleanly) at the end."""
    kubelet_dirs = ("var/lib/kubelet/device-plugins", "var/lib/kubelet/pod-resources")
    for path in (*kubelet_dirs, "run/baton", FAKE_DIR.lstrip("/")):
        (root / path).mkdir(parents=True)
    ports = {name: free_port() for name in ("agent", "deviceplugin", "extender")}
    kubelet = KubeletStub(root / kubelet_dirs[0], root / kubelet_dirs[1])
    kubelet.start()
    started = start_daemons(root, kubeconfig, ports)
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
        assert all(c == 0 for c in codes.values()), f"exit codes {codes}\n{logs}"
        for daemon in started:
            daemon.wait_for_line(r"stopped on SIGTERM", timeout=5)


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
        except subprocess.TimeoutExpired:
            container.proc.kill()
            raise
        node.outputs[name] = (container.proc.returncode, out, err)
        kubelet.finished(container, container.proc.returncode == 0)
    node.finished_at = time.time()
    node.agent_metrics = get_text(f"{node.agent_url}/metrics")


@pytest.fixture(scope="package")
def node() -> Iterator[Node]:
    root = Path(tempfile.mkdtemp(prefix="e2e-", dir="/tmp"))
    api = FakeApiServer().start()
    try:
        api.put_object(node_object(NODE, "127.0.0.3"))  # agents are reached by pod IP
        api.put_object(node_pod(NODE, "127.0.0.1"))
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

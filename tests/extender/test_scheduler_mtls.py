"""kube-scheduler, the real binary, binds through the extender over mutual TLS: the client
certificate its `tlsConfig` names is what lets `/bind` act, and without one its bind is refused.

etcd and kube-apiserver are real (no kubelet: the node is an API object with the device
plugin's annotations and slots); the extender is `baton extender` as deployed, with
`--tls-client-ca`.
"""

from __future__ import annotations

import contextlib
import ssl
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from baton.contract import names
from baton.contract.kube import load_api_client
from commands.localnode.controlplane import ControlPlane, free_ports
from commands.localnode.procs import Process, wait_for
from tests.apiserver import api_server
from tests.extender.builders import node
from tests.tlscerts import Authority

NODE = "n1"
WAIT_S = 60


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with api_server(tmp_path_factory, "mtls-plane") as plane:
        yield plane


@pytest.fixture
def core(plane: ControlPlane) -> Iterator[Any]:
    """The core API with node `NODE` (the device plugin's annotations, slots and room)."""
    from kubernetes import client

    api_client = load_api_client(str(plane.admin_kubeconfig))
    api: Any = client.CoreV1Api(api_client)
    body = node(NODE)
    status = body.pop("status")
    status["allocatable"]["pods"] = "110"
    status["capacity"] = status["allocatable"]
    with contextlib.suppress(client.ApiException):  # no controller makes it here
        api.create_namespaced_service_account("default", {"metadata": {"name": "default"}})
    api.create_node(body)
    api.patch_node(NODE, {"spec": {"taints": None}})  # the not-ready taint create gives it
    api.patch_node_status(NODE, {"status": status})
    try:
        yield api
    finally:
        api.delete_collection_namespaced_pod("default", grace_period_seconds=0)
        api.delete_node(NODE)
        api_client.close()


def test_kube_schedulers_client_certificate_is_what_binds(
    plane: ControlPlane, core: Any, tmp_path: Path
) -> None:
    serving = Authority(tmp_path, "serving CA")
    cert, key = serving.issue("baton-extender", ("127.0.0.1",))
    clients = Authority(tmp_path, "scheduler CA")
    client_cert, client_key = clients.issue("baton-scheduler", client=True)
    (port,) = free_ports(1)
    extender = Process(
        "baton-extender",
        [
            str(Path(sys.executable).parent / "baton"),
            "extender",
            f"--kubeconfig={plane.admin_kubeconfig}",
            "--host=127.0.0.1",
            f"--port={port}",
            f"--tls-cert={cert}",
            f"--tls-key={key}",
            f"--tls-client-ca={clients.cert}",
        ],
        tmp_path / "extender.log",
    ).start()
    try:
        trust = httpx.Client(verify=ssl.create_default_context(cafile=serving.cert), timeout=5)
        with trust:
            wait_for("the extender's caches", lambda: _ready(trust, port, extender), WAIT_S)
        pod = _tenant_pod()
        core.create_namespaced_pod("default", pod)

        # A kube-scheduler whose tlsConfig names no client certificate: its bind is refused.
        with _scheduler(plane, tmp_path / "anonymous", port, serving.cert, None):
            event = wait_for("the refused bind", lambda: _bind_refusal(core), WAIT_S)
        assert "code 403" in event, event
        assert _node_of(core) is None

        # kube-scheduler's own certificate: the extender binds the pod and assigns its GPU.
        with _scheduler(plane, tmp_path / "mtls", port, serving.cert, (client_cert, client_key)):
            bound = wait_for("the bind", lambda: _node_of(core), WAIT_S)
        assert bound == NODE
        placed = core.read_namespaced_pod("tenant", "default")
        assert placed.metadata.annotations[names.ANNOTATION_ASSIGNED_GPUS].startswith("GPU-n1-")
    finally:
        extender.stop()
    assert "(/bind for client certificates of --tls-client-ca only)" in extender.log.read_text()


def _ready(client: httpx.Client, port: int, extender: Process) -> bool | None:
    extender.check()
    try:
        return client.get(f"https://127.0.0.1:{port}/readyz").status_code == 200 or None
    except httpx.TransportError:
        return None


def _tenant_pod() -> dict[str, Any]:
    limits = {names.RESOURCE_GPU: "1", names.RESOURCE_GPU_MEMORY: "1024", "cpu": "1"}
    return {
        "metadata": {"name": "tenant"},
        "spec": {
            "schedulerName": names.SCHEDULER_NAME,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/tenant:1",
                    "resources": {"limits": limits},
                }
            ],
        },
    }


def _node_of(core: Any) -> str | None:
    return core.read_namespaced_pod("tenant", "default").spec.node_name or None


def _bind_refusal(core: Any) -> str | None:
    for event in core.list_namespaced_event("default").items:
        if event.involved_object.name == "tenant" and "bind" in (event.message or ""):
            return str(event.message)
    return None


class _scheduler:
    """A kube-scheduler of the `baton-scheduler` profile asking the extender over HTTPS."""

    def __init__(
        self,
        plane: ControlPlane,
        root: Path,
        port: int,
        ca: Path,
        client: tuple[Path, Path] | None,
    ):
        root.mkdir()
        tls: dict[str, str] = {"caFile": str(ca)}
        if client is not None:
            tls.update(certFile=str(client[0]), keyFile=str(client[1]))
        managed = [
            {"name": names.RESOURCE_GPU, "ignoredByScheduler": False},
            {"name": names.RESOURCE_GPU_MEMORY, "ignoredByScheduler": True},
            {"name": names.RESOURCE_GPU_DUTY, "ignoredByScheduler": True},
        ]
        config = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(plane.admin_kubeconfig)},
            "leaderElection": {"leaderElect": False},
            "profiles": [{"schedulerName": names.SCHEDULER_NAME}],
            "extenders": [
                {
                    "urlPrefix": f"https://127.0.0.1:{port}",
                    "filterVerb": "filter",
                    "prioritizeVerb": "prioritize",
                    "bindVerb": "bind",
                    "weight": 5,
                    "nodeCacheCapable": True,
                    "httpTimeout": "5s",
                    "ignorable": False,
                    "enableHTTPS": True,
                    "tlsConfig": tls,
                    "managedResources": managed,
                }
            ],
        }
        path = root / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        self.process = Process(
            "kube-scheduler",
            [str(plane.binaries.kube_scheduler), f"--config={path}", "--secure-port=0"],
            root / "kube-scheduler.log",
        )

    def __enter__(self) -> Process:
        return self.process.start()

    def __exit__(self, *exc: object) -> None:
        self.process.stop()

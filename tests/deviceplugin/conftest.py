"""Fixtures: a short socket directory, a kubelet stub in it, and a device plugin daemon."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from baton.contract import names
from baton.contract.kube import format_timestamp_ns
from commands.bench.memory_pods import MemoryPods
from deviceplugin.allocation import PodSource
from deviceplugin.daemon import Daemon, Settings
from nodegpu.gpus import parse_fake_gpus
from nodegpu.health import DEFAULT_IGNORED_XIDS
from tests.harness.fakeapi import FakeApiServer
from tests.harness.kubelet import KubeletStub
from tests.harness.podresources import AdmittedPod, ContainerAsk

NODE = "node-a"
StartPlugin = Callable[..., Daemon]


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(socket_dir: Path) -> Iterator[KubeletStub]:
    (socket_dir / "pod-resources").mkdir()
    stub = KubeletStub(socket_dir, socket_dir / "pod-resources")
    stub.start()
    yield stub
    stub.stop()


@pytest.fixture
def start_plugin(socket_dir: Path) -> Iterator[StartPlugin]:
    started: list[Daemon] = []

    def start(
        source: PodSource | None = None,
        gpus: str = "2x81920",
        slots: int = 4,
        api_client: object = None,
        cdi: bool = False,
        reconcile_interval_s: float = 10.0,
        plugin_dir: Path | None = None,
        pod_resources_socket: Path | None = None,
    ) -> Daemon:
        settings = Settings(
            node_name=NODE,
            plugin_dir=plugin_dir or socket_dir,
            slots_per_gpu=slots,
            host_memory_budget_mib=4096,
            cdi=cdi,
            metrics_host="127.0.0.1",
            metrics_port=0,
            ignored_xids=frozenset(DEFAULT_IGNORED_XIDS),
            pod_resources_socket=pod_resources_socket
            or socket_dir / "pod-resources" / "kubelet.sock",
            reconcile_interval_s=reconcile_interval_s,
        )
        daemon = Daemon(
            settings,
            parse_fake_gpus(gpus, NODE),
            fake=True,
            api_client=api_client,
            source=source if source is not None or api_client is not None else MemoryPods(),
        )
        daemon.start()
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()


@pytest.fixture
def fake_api(fake_api: FakeApiServer) -> FakeApiServer:
    fake_api.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    return fake_api


def tenant_pod(
    name: str,
    gpus: tuple[str, ...] = (),
    assigned_at_ns: int | None = None,
    request: int = 1,
    node: str = NODE,
    containers: dict[str, int] | None = None,
    inits: dict[str, int] | None = None,
) -> dict[str, Any]:
    """A Pending tenant pod on `node` asking for `request` baton.dev/gpu (or, per container,
    `containers` and init containers `inits`), maybe assigned."""
    annotations = {}
    if gpus:
        annotations[names.ANNOTATION_ASSIGNED_GPUS] = ",".join(gpus)
    if assigned_at_ns is not None:
        annotations[names.ANNOTATION_ASSIGNED_AT] = format_timestamp_ns(assigned_at_ns)

    def spec(asks: dict[str, int]) -> list[dict[str, Any]]:
        return [
            {"name": c, "image": "tenant", "resources": {"limits": {names.RESOURCE_GPU: str(n)}}}
            for c, n in asks.items()
        ]

    pod_spec: dict[str, Any] = {
        "nodeName": node,
        "schedulerName": names.SCHEDULER_NAME,
        "containers": spec(containers or {"main": request}),
    }
    if inits:
        pod_spec["initContainers"] = spec(inits)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": pod_spec,
        "status": {"phase": "Pending"},
    }


def admit(kubelet: KubeletStub, pod: dict[str, Any]) -> AdmittedPod:
    """Admit a pod object through the kubelet stub, container by container (init first)."""
    spec = pod["spec"]

    def asks(key: str) -> list[ContainerAsk]:
        return [
            ContainerAsk(c["name"], int(c["resources"]["limits"].get(names.RESOURCE_GPU, 0)))
            for c in spec.get(key) or []
        ]

    meta = pod["metadata"]
    return kubelet.admit_pod(
        meta["namespace"], meta["name"], asks("containers"), asks("initContainers")
    )

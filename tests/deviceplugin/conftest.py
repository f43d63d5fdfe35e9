"""Fixtures: a short socket directory, a kubelet stub in it, and a device plugin daemon."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from baton import names
from baton.bench.memory_pods import MemoryPods
from baton.kube import format_timestamp_ns
from deviceplugin.allocation import PodSource
from deviceplugin.daemon import Daemon, Settings
from deviceplugin.gpus import parse_fake_gpus
from deviceplugin.health import DEFAULT_IGNORED_XIDS
from tests.harness.fakeapi import FakeApiServer
from tests.harness.kubelet import KubeletStub

NODE = "node-a"
StartPlugin = Callable[..., Daemon]


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(socket_dir: Path) -> Iterator[KubeletStub]:
    stub = KubeletStub(socket_dir)
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
    ) -> Daemon:
        settings = Settings(
            node_name=NODE,
            plugin_dir=socket_dir,
            slots_per_gpu=slots,
            host_memory_budget_mib=4096,
            cdi=cdi,
            metrics_host="127.0.0.1",
            metrics_port=0,
            ignored_xids=frozenset(DEFAULT_IGNORED_XIDS),
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
) -> dict[str, Any]:
    """A Pending tenant pod on `node` asking for `request` baton.dev/gpu, maybe assigned."""
    annotations = {}
    if gpus:
        annotations[names.ANNOTATION_ASSIGNED_GPUS] = ",".join(gpus)
    if assigned_at_ns is not None:
        annotations[names.ANNOTATION_ASSIGNED_AT] = format_timestamp_ns(assigned_at_ns)
    limits = {names.RESOURCE_GPU: str(request)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {
            "nodeName": node,
            "schedulerName": names.SCHEDULER_NAME,
            "containers": [{"name": "main", "image": "tenant", "resources": {"limits": limits}}],
        },
        "status": {"phase": "Pending"},
    }

"""The real node on containerd 2.x (CDI) with Baton installed as a DRA driver (local-dra).

One local node runs per machine: this package's node is brought up for the package and torn
down after it, before the device-plugin node of tests/k8s (pytest collects `dra/` first).
Skips as tests/k8s does, and when no containerd 2.x tarball is beside the binaries.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from commands.localnode.binaries import find_containerd2, search_dirs
from commands.localnode.install import HOST_DIRS, install_baton_dra
from commands.localnode.node import CONTAINERD_SHARED, LocalNode
from tests.k8s.cluster import Cluster, wait_for
from tests.k8s.conftest import _skip_unless_possible, delete_namespace
from tests.k8s.pods import namespace_obj

CDI_DIR = Path("/var/run/cdi")


def containerd2_node(factory: pytest.TempPathFactory, name: str) -> LocalNode:
    """A local node (not started) on containerd 2.x, cleaning the CDI specs pods leave."""
    return LocalNode(
        factory.mktemp(name), scratch_dirs=(*HOST_DIRS, CDI_DIR), containerd=CONTAINERD_SHARED
    )


@pytest.fixture(scope="package")
def dra_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A Ready node on containerd 2.x with the DRA driver's ResourceSlice published."""
    _skip_unless_possible()
    if find_containerd2() is None:
        where = ", ".join(str(d) for d in search_dirs())
        pytest.skip(f"needs containerd-v2.*-linux-amd64.tar.xz in {where}")
    node = containerd2_node(tmp_path_factory, "localnode-dra")
    try:
        node.start()
        began = time.monotonic()
        install_baton_dra(node)
        timings = {**node.timings, "install_s": time.monotonic() - began}
        print(f"\nlocal DRA node: {', '.join(f'{k} {v:.1f}' for k, v in timings.items())}")
        yield Cluster(node)
    finally:
        node.close()


@pytest.fixture(scope="module")
def dra_namespace(dra_cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of the test module's own, deleted (pods and claims) after it."""
    name = "dra-" + request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    name = name.replace("_", "-")
    dra_cluster.apply(namespace_obj(name))
    wait_for(
        f"namespace {name}'s default ServiceAccount",
        lambda: dra_cluster.try_kubectl("get", "serviceaccount", "-n", name, "default"),
        30,
    )
    try:
        yield name
    finally:
        delete_namespace(dra_cluster, name)

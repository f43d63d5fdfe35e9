"""The real single node, brought up once per session and shared by every test here.

Skips with "needs Kubernetes binaries" when none are found (BATON_KUBE_BIN_DIR or ../shared/k8s)
and with "needs system package ..." when containerd, runc, the CNI plugins or mmdebstrap are
missing; CI fails on both skips.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest

from commands.localnode.binaries import find_binaries, search_dirs
from commands.localnode.install import HOST_DIRS, install_baton
from commands.localnode.node import LocalNode
from commands.localnode.runtime import CNI_BIN_DIRS
from tests.k8s.cluster import Cluster, wait_for
from tests.k8s.nodelogs import node_logs
from tests.k8s.pods import namespace_obj

PACKAGES = {
    "containerd": lambda: shutil.which("containerd") and shutil.which("ctr"),
    "runc": lambda: shutil.which("runc"),
    "containernetworking-plugins": lambda: any(Path(d, "bridge").exists() for d in CNI_BIN_DIRS),
    "mmdebstrap": lambda: shutil.which("mmdebstrap"),
    "kubernetes-client": lambda: shutil.which("kubectl"),
    "gcc": lambda: shutil.which("gcc"),
    "openssl": lambda: shutil.which("openssl"),
}
TIMINGS: dict[str, float] = {}


def _skip_unless_possible() -> None:
    if find_binaries() is None:
        where = ", ".join(str(d) for d in search_dirs())
        pytest.skip(f"needs Kubernetes binaries (BATON_KUBE_BIN_DIR, or in {where})")
    for package, present in PACKAGES.items():
        if not present():
            pytest.skip(f"needs system package {package}")
    if os.geteuid() != 0:
        pytest.skip("needs root (a kubelet and containerd run here)")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A Ready node with Baton installed from manifests/overlays/local."""
    _skip_unless_possible()
    node = LocalNode(tmp_path_factory.mktemp("localnode"), scratch_dirs=HOST_DIRS)
    try:
        node.start()
        began = time.monotonic()
        install_baton(node)
        TIMINGS.update(node.timings, install_s=time.monotonic() - began)
        print(f"\nlocal node: {', '.join(f'{k} {v:.1f}' for k, v in TIMINGS.items())}")
        yield Cluster(node)
    finally:
        node.close()


@pytest.fixture(scope="module")
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of the test module's own, deleted (pods and all) after it."""
    name = "t-" + request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace("_", "-")
    cluster.apply(namespace_obj(name))
    wait_for(
        f"namespace {name}'s default ServiceAccount",
        lambda: cluster.try_kubectl("get", "serviceaccount", "-n", name, "default"),
        30,
    )
    try:
        yield name
    finally:
        delete_namespace(cluster, name)


def delete_namespace(cluster: Cluster, name: str) -> None:
    """Delete a namespace and wait until its pods are gone (their GPU slots free again)."""
    cluster.kubectl("delete", "pod", "--all", "-n", name, "--grace-period=0", "--force")
    cluster.kubectl("delete", "namespace", name, "--wait=false")
    wait_for(
        f"namespace {name} to be gone",
        lambda: True if cluster.try_kubectl("get", "namespace", name) is None else None,
        60,
    )


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Pod names unique within the session."""
    counter = iter(range(1_000_000))
    return lambda base: f"{base}-{next(counter)}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Room for the first test, which waits for the node (and a cold image build, ~2 min)."""
    for item in items:
        if "tests/k8s/" in str(item.path):
            item.add_marker(pytest.mark.timeout(600))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed real-node test's report carries the node's logs (kubelet, containerd, daemons)."""
    report: pytest.TestReport = yield
    funcargs = getattr(item, "funcargs", {})
    # `cluster`, `dra_cluster`, or tests/k8s/helm's `release` and `helm_node`
    cluster = next((arg for arg in funcargs.values() if isinstance(arg, Cluster)), None)
    if report.failed and cluster is not None:
        try:
            report.sections.append(("the node's logs", node_logs(cluster)))
        except Exception as err:  # the report must not lose the test's own failure
            report.sections.append(("the node's logs", f"could not be read: {err!r}"))
    return report

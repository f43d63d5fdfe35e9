"""etcd and a real kube-apiserver on free loopback ports (no controllers, no scheduler, no
kubelet), for the tests that need only the API; skipped where the binaries are missing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from commands.localnode.binaries import find_binaries, search_dirs
from commands.localnode.controlplane import ControlPlane


@contextmanager
def api_server(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[ControlPlane]:
    """A control plane of etcd and kube-apiserver under a fresh temporary directory `name`."""
    if find_binaries() is None:
        where = ", ".join(str(d) for d in search_dirs())
        pytest.skip(f"needs Kubernetes binaries (BATON_KUBE_BIN_DIR, or in {where})")
    root = tmp_path_factory.mktemp(name)
    with ControlPlane(root, controller_manager=False, scheduler=False, ports="free") as plane:
        yield plane

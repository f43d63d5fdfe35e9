"""A real kube-apiserver (and etcd) on free loopback ports, for the coordinator's tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from commands.localnode.controlplane import ControlPlane
from tests.apiserver import api_server

LEASE_NS = "baton-system"
TEAM = "team"


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd and kube-apiserver only (no controllers, no scheduler, no kubelet)."""
    with api_server(tmp_path_factory, "coordinator-plane") as plane:
        yield plane


@pytest.fixture(scope="session")
def core(control_plane: ControlPlane) -> Any:
    from kubernetes import client

    from baton.contract.kube import load_api_client

    api: Any = client.CoreV1Api(load_api_client(str(control_plane.admin_kubeconfig)))
    for name in (LEASE_NS, TEAM):
        api.create_namespace({"metadata": {"name": name}})
    # No controller manager here: the pods' service account is made by hand.
    api.create_namespaced_service_account(TEAM, {"metadata": {"name": "default"}})
    return api  # the namespaces go with the control plane (no controller would finish deleting)

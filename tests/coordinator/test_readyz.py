"""`/readyz` of a coordinator the API server refuses (its ServiceAccount lacks a role): it says
what was refused, rather than that it stands by, is settling turns, or is ready."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import yaml

from baton.contract.kube import load_api_client
from commands.localnode.controlplane import ControlPlane
from commands.localnode.procs import wait_for
from coordinator import daemon
from coordinator.daemon import Coordinator, CoordinatorConfig
from tests.coordinator.conftest import LEASE_NS
from tests.harness.agent import http_get

WAIT_S = 30.0
FORBIDDEN = "API server answered 403 Forbidden"
PODS, NODES = 'cannot list resource "pods"', 'cannot list resource "nodes"'


@contextmanager
def account(plane: ControlPlane, core: Any, lease_role: bool) -> Iterator[Any]:
    """An API client with the token of a fresh ServiceAccount bound to no role, or (`lease_role`)
    to one that may read and write Leases in the Lease's namespace only."""
    from kubernetes import client

    name = f"coordinator-{uuid.uuid4().hex[:8]}"
    core.create_namespaced_service_account(LEASE_NS, {"metadata": {"name": name}})
    rbac: Any = client.RbacAuthorizationV1Api(load_api_client(str(plane.admin_kubeconfig)))
    if lease_role:
        rule = {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["*"]}
        rbac.create_namespaced_role(LEASE_NS, {"metadata": {"name": name}, "rules": [rule]})
        rbac.create_namespaced_role_binding(
            LEASE_NS,
            {
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": LEASE_NS}],
            },
        )
    token = core.create_namespaced_service_account_token(name, LEASE_NS, {"spec": {}}).status.token
    config = yaml.safe_load(plane.admin_kubeconfig.read_text())
    config["users"] = [{"name": config["users"][0]["name"], "user": {"token": token}}]
    path = plane.admin_kubeconfig.with_name(f"{name}.kubeconfig")
    path.write_text(yaml.safe_dump(config))
    api_client = load_api_client(str(path))
    try:
        yield api_client
    finally:
        api_client.close()
        path.unlink()


def readyz_until(coordinator: Coordinator, *wanted: str) -> tuple[int, str]:
    """/readyz, once its answer holds every one of `wanted` (bounded): the Lease and each watch
    are refused in their own threads, in no set order."""
    url = f"http://127.0.0.1:{coordinator.http_port}/readyz"
    seen: list[tuple[int, str]] = []

    def answer() -> bool | None:
        seen[:] = [http_get(url)]
        return True if all(w in seen[0][1] for w in wanted) else None

    try:
        wait_for(f"/readyz saying {wanted}", answer, WAIT_S)
    except Exception as err:
        raise AssertionError(f"/readyz answered {seen}") from err
    return seen[0]


def start(api_client: Any, lease: str) -> Coordinator:
    config = CoordinatorConfig(
        token="token",
        namespace=LEASE_NS,
        lease_name=lease,
        identity="c0",
        llmd_listen="127.0.0.1:0",
        http_listen="127.0.0.1:0",
        lease_duration_s=3,
        renew_deadline_s=2,
        retry_period_s=0.2,
    )
    return Coordinator(config, api_client)


def test_a_replica_refused_the_lease_and_its_watches_says_so(
    control_plane: ControlPlane, core: Any
) -> None:
    lease = f"refused-{uuid.uuid4().hex[:8]}"

    async def body(api_client: Any) -> None:
        coordinator = start(api_client, lease)
        await coordinator.start()
        try:
            wanted = ("cannot be read", PODS, NODES)
            status, line = await asyncio.to_thread(readyz_until, coordinator, *wanted)
            assert status == 503
            assert line.startswith(
                f"not ready: not leading: Lease {LEASE_NS}/{lease} cannot be read or taken "
                f'({FORBIDDEN}: leases.coordination.k8s.io "{lease}" is forbidden'
            ), line
            assert "stands by" not in line, line
            assert "the watch of pods labelled" in line, line  # its watches (waited for)
            assert line.count("\n") == 1, line
        finally:
            await coordinator.stop()

    with account(control_plane, core, lease_role=False) as api_client:
        asyncio.run(asyncio.wait_for(body(api_client), 60))


def test_a_leader_whose_watches_are_refused_says_it_knows_no_job_from_them(
    control_plane: ControlPlane, core: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It may take the Lease, not list pods or nodes: while it takes over, and once it leads
    without them (after LIST_WAIT_S), /readyz names the watches and why, not 'ready'."""
    monkeypatch.setattr(daemon, "LIST_WAIT_S", 1.0)
    lease = f"blind-{uuid.uuid4().hex[:8]}"

    async def body(api_client: Any) -> None:
        coordinator = start(api_client, lease)
        await coordinator.start()
        try:
            wanted = ("leading with", PODS, NODES)
            status, line = await asyncio.to_thread(readyz_until, coordinator, *wanted)
            assert status == 503
            assert line.startswith("not ready: leading with epoch 1, but the watch of "), line
            assert f"{FORBIDDEN}: pods is forbidden" in line, line
            assert "it knows no job or agent it does not list" in line, line
        finally:
            await coordinator.stop()

    with account(control_plane, core, lease_role=True) as api_client:
        asyncio.run(asyncio.wait_for(body(api_client), 60))

"""The coordinator's and the agent's roles as a real kube-apiserver applies them: manifests/ is
applied, and `baton coordinator` runs with its ServiceAccount's token only: it takes its Lease,
labels its own pod while it leads (and removes the label an older leader left on another pod),
and on SIGTERM removes the label and releases the Lease, refused nothing on the way. (The
daemons' other roles run on the real node: tests/k8s.)"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from baton.contract import names
from tests.apiserver import api_server

ROOT = Path(__file__).resolve().parents[1]
SA = f"system:serviceaccount:{names.NAMESPACE}"
POD = "baton-coordinator-0"
STALE = "baton-coordinator-1"
"""The pod of a leader of an older epoch, frozen or cut off, that kept its label."""
ALLOWED = [
    ("baton-agent", "get", "nodes", None),
    ("baton-agent", "patch", "nodes", None),
    ("baton-coordinator", "list", "pods", "--all-namespaces"),
    ("baton-coordinator", "watch", "nodes", None),
    ("baton-deviceplugin", "watch", "nodes", None),
    ("baton-coordinator", "patch", "pods", names.NAMESPACE),
    ("baton-coordinator", "create", "leases", names.NAMESPACE),
    ("baton-coordinator", "update", f"leases/{names.COORDINATOR_LEASE}", names.NAMESPACE),
]
DENIED = [
    ("baton-agent", "list", "nodes", None),
    ("baton-coordinator", "patch", "pods", "default"),
    ("baton-coordinator", "patch", "nodes", None),
    ("baton-coordinator", "update", "leases/baton-scheduler", names.NAMESPACE),
    ("baton-coordinator", "get", "secrets", names.NAMESPACE),
]


class Plane:
    """kubectl with the admin's kubeconfig on a control plane holding manifests/."""

    def __init__(self, kubeconfig: Path, kubectl: str) -> None:
        self.kubeconfig = kubeconfig
        self._kubectl = kubectl

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        done = subprocess.run(
            [self._kubectl, "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout

    def can(self, account: str, verb: str, resource: str, namespace: str | None) -> bool:
        scope = [namespace] if namespace == "--all-namespaces" else ["-n", namespace or "default"]
        done = subprocess.run(
            [self._kubectl, "--kubeconfig", str(self.kubeconfig), "auth", "can-i", verb,
             resource, f"--as={SA}:{account}", *scope],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        return done.stdout.strip() == "yes"

    def pod_labels(self, name: str = POD) -> dict[str, str]:
        pod = json.loads(self.kubectl("-n", names.NAMESPACE, "get", "pod", name, "-o", "json"))
        return dict(pod["metadata"].get("labels") or {})

    def lease_holder(self) -> str:
        path = "jsonpath={.spec.holderIdentity}"
        lease = ("get", "lease", names.COORDINATOR_LEASE, "-o", path)
        return self.kubectl("-n", names.NAMESPACE, *lease)


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("needs system package kubernetes-client (kubectl)")
    with api_server(tmp_path_factory, "rbac-plane") as control:
        found = Plane(control.admin_kubeconfig, kubectl)
        found.kubectl("apply", "--server-side", "-k", str(ROOT / "manifests"))
        yield found


@pytest.mark.parametrize(("account", "verb", "resource", "namespace"), ALLOWED)
def test_allowed(plane: Plane, account: str, verb: str, resource: str, namespace: str) -> None:
    assert plane.can(account, verb, resource, namespace)


@pytest.mark.parametrize(("account", "verb", "resource", "namespace"), DENIED)
def test_denied(plane: Plane, account: str, verb: str, resource: str, namespace: str) -> None:
    assert not plane.can(account, verb, resource, namespace)


def service_account_kubeconfig(plane: Plane, root: Path) -> Path:
    """The admin's kubeconfig with baton-coordinator's token as its only credential."""
    token = plane.kubectl("-n", names.NAMESPACE, "create", "token", "baton-coordinator").strip()
    config: dict[str, Any] = yaml.safe_load(plane.kubeconfig.read_text())
    config["users"] = [{"name": config["users"][0]["name"], "user": {"token": token}}]
    path = root / "coordinator.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_coordinator_leads_and_steps_down_under_its_roles(plane: Plane, tmp_path: Path) -> None:
    from commands.localnode.controlplane import free_ports
    from commands.localnode.procs import Process, wait_for

    # Its pod, as the Deployment would make it (no kubelet here: it stays Pending), and the
    # labelled pod of an older leader.
    leader = names.LABEL_COORDINATOR_LEADER
    spec = {"serviceAccountName": "baton-coordinator", "containers": [{"name": "c", "image": "b"}]}
    app = {"app.kubernetes.io/name": "baton-coordinator"}
    for name, labels in ((POD, app), (STALE, {**app, leader: "true"})):
        meta = {"name": name, "namespace": names.NAMESPACE, "labels": labels}
        pod = {"apiVersion": "v1", "kind": "Pod", "spec": spec, "metadata": meta}
        plane.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    (tmp_path / "token").write_text("t" * 40)
    (port,) = free_ports(1)
    argv = [sys.executable, "-m", "baton", "coordinator", "--llmd-listen", f"127.0.0.1:{port}",
            "--kubeconfig", str(service_account_kubeconfig(plane, tmp_path))]  # fmt: skip
    env = {"POD_NAME": POD, "POD_NAMESPACE": names.NAMESPACE,
           "BATON_COORDINATION_TOKEN_FILE": str(tmp_path / "token")}  # fmt: skip
    coordinator = Process("coordinator", argv, tmp_path / "coordinator.log", env).start()
    try:
        wait_for("the leader's label", lambda: plane.pod_labels().get(leader) or None, 30)
        assert plane.lease_holder() == POD
        stale = lambda: True if leader not in plane.pod_labels(STALE) else None  # noqa: E731
        wait_for("the older leader's label removed", stale, 10)
    finally:
        coordinator.stop()
    wait_for("the label's removal", lambda: True if leader not in plane.pod_labels() else None, 10)
    assert plane.lease_holder() == "", "a stopping leader releases its Lease"
    log = (tmp_path / "coordinator.log").read_text()
    assert "forbidden" not in log.lower(), log

"""RBAC: each daemon works with its own ServiceAccount, and is refused outside its role."""

from __future__ import annotations

import pytest

from baton.contract import names
from tests.k8s.cluster import Cluster

SA = f"system:serviceaccount:{names.NAMESPACE}"
ALLOWED = [
    ("baton-agent", "list", "pods"),
    ("baton-agent", "watch", "pods"),
    ("baton-deviceplugin", "patch", "nodes"),
    ("baton-deviceplugin", "patch", "pods"),
    ("baton-deviceplugin", "watch", "pods"),
    ("baton-extender", "get", "pods"),
    ("baton-extender", "create", "pods/binding"),
    ("baton-extender", "watch", "nodes"),
    ("baton-scheduler", "create", "bindings"),
    ("baton-scheduler", "watch", "pods"),
]
DENIED = [
    ("baton-agent", "patch", "pods"),
    ("baton-agent", "get", "secrets"),
    ("baton-deviceplugin", "delete", "pods"),
    ("baton-deviceplugin", "create", "pods/binding"),
    ("baton-extender", "patch", "nodes"),
    ("baton-extender", "patch", "pods"),
    ("baton-extender", "delete", "pods"),
    ("baton-scheduler", "patch", "nodes"),
    ("baton-scheduler", "get", "secrets"),
]


def can_i(cluster: Cluster, account: str, verb: str, resource: str) -> str:
    kind, _, sub = resource.partition("/")
    argv = ["auth", "can-i", verb, kind, f"--as={SA}:{account}", "--all-namespaces"]
    argv += [f"--subresource={sub}"] if sub else []
    return cluster.node.kubectl(*argv, check=False).strip()


@pytest.mark.parametrize(("account", "verb", "resource"), ALLOWED)
def test_role_allows_what_the_daemon_does(
    cluster: Cluster, account: str, verb: str, resource: str
) -> None:
    assert can_i(cluster, account, verb, resource) == "yes"


@pytest.mark.parametrize(("account", "verb", "resource"), DENIED)
def test_real_authorizer_denies_outside_the_role(
    cluster: Cluster, account: str, verb: str, resource: str
) -> None:
    assert can_i(cluster, account, verb, resource) == "no"


@pytest.mark.parametrize(
    "app", ["baton-agent", "baton-deviceplugin", "baton-extender", "baton-scheduler"]
)
def test_each_daemon_runs_as_its_own_service_account(cluster: Cluster, app: str) -> None:
    pod = cluster.daemon_pod(app)
    spec = pod["spec"]
    assert spec["serviceAccountName"] == app
    projected = [v for v in spec["volumes"] if v.get("projected")]
    sources = [s for v in projected for s in v["projected"]["sources"]]
    assert any("serviceAccountToken" in s for s in sources), "no bound service-account token"
    logs = cluster.logs(names.NAMESPACE, pod["metadata"]["name"])
    denied = [line for line in logs.splitlines() if "forbidden" in line.lower()]
    # A kube-apiserver that has just restarted (tests/k8s/test_faults.py) answers 403 until its
    # RBAC caches are filled; the daemons say so and retry. Any other denial is a missing grant.
    lasting = [line for line in denied if "retrying with backoff" not in line]
    assert not lasting, "\n".join(lasting)

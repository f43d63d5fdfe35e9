"""RBAC: each daemon works with its own ServiceAccount, and is refused outside its role."""

from __future__ import annotations

import re

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


DENIAL = re.compile(
    r'(?:"(?P<name>[^"]+)"|\S+) is forbidden: User "(?P<user>[^"]+)" cannot (?P<verb>\S+) resource '
    r'"(?P<resource>[^"]+)" in API group "(?P<group>[^"]*)"(?: in the namespace "(?P<ns>[^"]+)")?'
)


def still_denied(cluster: Cluster, line: str) -> bool:
    """Whether the real authorizer refuses now what `line` (a daemon's log) says it refused.

    A kube-apiserver that has just restarted (tests/k8s/test_faults.py) refuses until its RBAC
    caches are filled, naming a bound role as "not found"; kube-scheduler reads its
    authentication config once at start and only warns. Allowed now: that was the cache. Still
    refused, or a line that cannot be read: a missing grant.
    """
    found = DENIAL.search(line.replace('\\"', '"'))  # (klog's err="..." escapes its quotes)
    if found is None:
        return True
    kind = found["resource"] + (f".{found['group']}" if found["group"] else "")
    what = f"{kind}/{found['name']}" if found["name"] else kind  # a list names no object
    argv = ["auth", "can-i", found["verb"], what, f"--as={found['user']}"]
    argv += ["-n", found["ns"]] if found["ns"] else []
    return cluster.node.kubectl(*argv, check=False).strip() != "yes"


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
    # RBAC caches are filled; our daemons say so and retry, kube-scheduler warns once. Any
    # other denial is a missing grant.
    retried = [line for line in denied if "retrying with backoff" not in line]
    lasting = [line for line in retried if still_denied(cluster, line)]
    assert not lasting, "\n".join(lasting)


def test_a_denial_the_authorizer_still_makes_is_told_from_a_cold_cache(cluster: Cluster) -> None:
    """The check above tells a lasting denial from one a restarted API server made."""
    cold = (
        "W1202 authentication.go:397] Error looking up in-cluster authentication configuration: "
        'configmaps "extension-apiserver-authentication" is forbidden: User '
        '"system:serviceaccount:baton-system:baton-scheduler" cannot get resource "configmaps" '
        'in API group "" in the namespace "kube-system": RBAC: role.rbac.authorization.k8s.io '
        '"extension-apiserver-authentication-reader" not found'
    )
    assert not still_denied(cluster, cold)
    lasting = cold.replace("baton-scheduler", "baton-agent")  # never granted that configmap
    assert still_denied(cluster, lasting)
    assert still_denied(cluster, "E1202 forbidden, in words this check cannot read")
    structured = (  # a reflector's failed list, as kube-scheduler logs it: quotes escaped
        'E1207 reflector.go:227] "Failed to watch" err="failed to list *v1.PersistentVolumeClaim: '
        'persistentvolumeclaims is forbidden: User \\"system:serviceaccount:baton-system:'
        'baton-scheduler\\" cannot list resource \\"persistentvolumeclaims\\" in API group '
        '\\"\\" at the cluster scope" logger="UnhandledError"'
    )
    assert not still_denied(cluster, structured)
    assert still_denied(cluster, structured.replace("baton-scheduler", "baton-agent"))

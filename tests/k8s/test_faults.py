"""Faults on the real components, with nothing lost: every tenant still verifies its memory."""

from __future__ import annotations

from collections.abc import Callable

from baton.contract import names
from tests.k8s.cluster import DEVICE_PLUGIN_URL, Cluster, get_text, metric, wait_for
from tests.k8s.pods import tenant_pod

LONG_STEPS = 30
"""Enough turns (about 0.15 s each plus parking) that the fault lands while tenants run."""


def start_tenants(cluster: Cluster, namespace: str, names_: list[str]) -> None:
    """Long-running tenants, waited for until each has taken a turn."""
    cluster.apply(*(tenant_pod(n, namespace, steps=LONG_STEPS) for n in names_))
    for name in names_:
        cluster.wait_phase(namespace, name, {"Running"}, 60)
        wait_for(
            f"{name}'s first turn",
            lambda name=name: True if "held" in cluster.logs(namespace, name) else None,  # type: ignore[misc]
            60,
        )


def verified(cluster: Cluster, namespace: str, *pods: str) -> None:
    """Every pod Succeeded with its memory verified after every turn."""
    cluster.wait_succeeded(namespace, *pods, timeout=150)
    for name in pods:
        logs = cluster.logs(namespace, name)
        assert "memory verified" in logs and "done:" in logs, logs


def admitted_with_gpu(cluster: Cluster, namespace: str, name: str) -> None:
    """A new short tenant is scheduled, admitted with a GPU and finishes."""
    cluster.apply(tenant_pod(name, namespace, steps=2))
    verified(cluster, namespace, name)


def registrations() -> float:
    text = get_text(f"{DEVICE_PLUGIN_URL}/metrics")
    return metric(text, "baton_deviceplugin_registrations_total", outcome="ok")


def replaced(cluster: Cluster, app: str) -> Callable[[], None]:
    """Delete the daemon's pod; the returned wait ends once a new one is ready."""
    old = cluster.daemon_pod(app)["metadata"]["name"]
    cluster.kubectl("delete", "pod", "-n", names.NAMESPACE, old, "--wait=false")

    def wait() -> None:
        wait_for(
            f"{app} replaced",
            lambda: True if cluster.daemon_pod(app)["metadata"]["name"] != old else None,
            90,
        )

    return wait


def test_kubelet_restart_while_tenants_run(cluster: Cluster, namespace: str) -> None:
    start_tenants(cluster, namespace, ["kr-a", "kr-b"])
    before = registrations()
    cluster.node.stop_kubelet()
    cluster.node.start_kubelet()
    wait_for("the device plugin to register again", lambda: registrations() > before or None, 60)
    try:
        wait_for("the node's GPU slots back", lambda: cluster.allocatable_gpus() == 8 or None, 60)
    except AssertionError as err:  # say what the node and the plugin show, for the cause
        status = cluster.get("node", cluster.node_name)["status"]
        plugin = cluster.daemon_pod("baton-deviceplugin")["metadata"]["name"]
        raise AssertionError(
            f"{err}; node capacity {status.get('capacity')}, allocatable"
            f" {status.get('allocatable')}; device plugin log:\n"
            + "\n".join(cluster.logs(names.NAMESPACE, plugin).splitlines()[-30:])
        ) from None
    verified(cluster, namespace, "kr-a", "kr-b")
    admitted_with_gpu(cluster, namespace, "kr-after")


def test_agent_pod_deleted_while_tenants_run(cluster: Cluster, namespace: str) -> None:
    start_tenants(cluster, namespace, ["ag-a", "ag-b", "ag-c"])
    replaced(cluster, "baton-agent")()
    verified(cluster, namespace, "ag-a", "ag-b", "ag-c")


def test_device_plugin_pod_deleted(cluster: Cluster, namespace: str) -> None:
    replaced(cluster, "baton-deviceplugin")()
    wait_for("the node's GPU slots back", lambda: cluster.allocatable_gpus() == 8 or None, 60)
    admitted_with_gpu(cluster, namespace, "dp-after")


def test_apiserver_restart(cluster: Cluster, namespace: str) -> None:
    start_tenants(cluster, namespace, ["api-a"])
    cluster.node.plane.stop_apiserver()
    cluster.node.plane.start_apiserver()
    admitted_with_gpu(cluster, namespace, "api-after")
    verified(cluster, namespace, "api-a")


def test_extender_pod_deleted_while_pods_wait(cluster: Cluster, namespace: str) -> None:
    wait = replaced(cluster, "baton-extender")
    cluster.apply(*(tenant_pod(n, namespace, steps=2) for n in ("ex-a", "ex-b")))
    wait()
    verified(cluster, namespace, "ex-a", "ex-b")

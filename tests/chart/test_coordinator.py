"""The chart's cluster coordinator: on and off, its settings, the token Secret (made once, kept
across upgrades against a real API server, or the operator's), and the agents' half."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from baton.contract import names
from tests.apiserver import api_server
from tests.chart.helm import CHART, NAMESPACE, Obj, helm, refused, render

SECRET = "baton-coordination"
TOKEN = "t" * 40


def find(objs: list[Obj], kind: str, name: str) -> Obj | None:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) <= 1
    return found[0] if found else None


def container(objs: list[Obj], kind: str, name: str) -> Obj:
    workload = find(objs, kind, name)
    assert workload is not None, f"no {kind} {name}"
    (first, *_) = workload["spec"]["template"]["spec"]["containers"]
    return dict(first)


def env(part: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in part.get("env", [])}


def secret_names(objs: list[Obj]) -> set[str]:
    """The Secret every coordination-token volume (agent and coordinator) names."""
    return {
        v["secret"]["secretName"]
        for kind, name in (("DaemonSet", "baton-agent"), ("Deployment", "baton-coordinator"))
        for v in (find(objs, kind, name) or {})["spec"]["template"]["spec"]["volumes"]
        if v["name"] == "coordination-token"
    }


def token_of(objs: list[Obj]) -> str:
    secret = find(objs, "Secret", SECRET)
    assert secret is not None
    return base64.b64decode(secret["data"]["token"]).decode()


def test_the_chart_makes_a_random_token_unless_given_one() -> None:
    first, second = token_of(render()), token_of(render())
    assert len(first) == 64 and first.isalnum() and first != second
    assert token_of(render("--set", f"coordinator.token.value={TOKEN}")) == TOKEN


def test_both_daemons_mount_the_chart_secret_or_the_operators() -> None:
    objs = render()
    assert secret_names(objs) == {SECRET}
    mine = render("--set", "coordinator.token.existingSecret=mine")
    assert find(mine, "Secret", SECRET) is None
    assert secret_names(mine) == {"mine"}


def test_the_operators_secret_may_not_take_the_name_of_the_charts_own() -> None:
    """An upgrade from a release whose chart made baton-coordination deletes it once it is no
    longer rendered: the Secret the operator named would be gone under both daemons."""
    said = refused("--set", f"coordinator.token.existingSecret={SECRET}")
    assert f"coordinator.token.existingSecret {SECRET} is the chart's own Secret" in said, said
    render(
        "--set", f"coordinator.token.existingSecret={SECRET}", "--set", "coordinator.enabled=false"
    )


def test_a_given_token_restarts_both_daemons_when_it_changes() -> None:
    def checksums(objs: list[Obj]) -> set[str | None]:
        workloads = [
            find(objs, "DaemonSet", "baton-agent"),
            find(objs, "Deployment", "baton-coordinator"),
        ]
        return {
            (w["spec"]["template"]["metadata"].get("annotations") or {}).get(
                "checksum/coordination-token"
            )
            for w in workloads
            if w is not None
        }

    assert checksums(render()) == {None}, "a kept token must not restart anything"
    (one,) = checksums(render("--set", f"coordinator.token.value={TOKEN}"))
    (other,) = checksums(render("--set", f"coordinator.token.value={TOKEN}x"))
    assert one and other and one != other


def test_disabled_leaves_no_trace_in_the_agent() -> None:
    objs = render("--set", "coordinator.enabled=false")
    assert not [o for o in objs if "coordinat" in o["metadata"]["name"]]
    agent = container(objs, "DaemonSet", "baton-agent")
    assert not [e for e in env(agent) if "COORDINAT" in e or e == "POD_IP"]
    assert [p["containerPort"] for p in agent["ports"]] == [names.PORT_AGENT]
    role = find(objs, "ClusterRole", "baton-agent")
    assert role is not None and [r["resources"] for r in role["rules"]] == [["pods"]]


def test_settings_reach_the_coordinator() -> None:
    settings = {
        "coordinator.replicas": "3",
        "coordinator.queuePolicy": "fair",
        "coordinator.lease.durationSeconds": "20",
        "coordinator.lease.renewDeadlineSeconds": "12.5",
        "coordinator.lease.retryPeriodSeconds": "1",
        "coordinator.prepareTimeoutSeconds": "90",
    }
    objs = render(*[a for k, v in settings.items() for a in ("--set", f"{k}={v}")])
    deployment = find(objs, "Deployment", "baton-coordinator")
    assert deployment is not None and deployment["spec"]["replicas"] == 3
    assert {
        k: v for k, v in env(container(objs, "Deployment", "baton-coordinator")).items()
        if k.startswith("BATON_COORDINATOR_") and k != "BATON_COORDINATOR_NAMESPACE"
    } == {
        "BATON_COORDINATOR_QUEUE_POLICY": "fair",
        "BATON_COORDINATOR_LEASE_DURATION": "20",
        "BATON_COORDINATOR_RENEW_DEADLINE": "12.5",
        "BATON_COORDINATOR_RETRY_PERIOD": "1",
        "BATON_COORDINATOR_PREPARE_TIMEOUT": "90",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("flag", "setting", "named"),
    [
        ("--set", "coordinator.queuePolicy=lrs", "/coordinator/queuePolicy"),
        ("--set", "coordinator.replicas=0", "/coordinator/replicas"),
        ("--set", "coordinator.lease.durationSeconds=1.5", "/coordinator/lease/durationSeconds"),
        ("--set", "coordinator.token.value=short", "/coordinator/token/value"),
        (
            "--set",
            "coordinator.lease.renewDeadlineSeconds=30",
            "renewDeadlineSeconds (30) < durationSeconds",
        ),
        # a number given as a string (a values file's quoted "0", --set's "0.0") keeps its range
        ("--set-string", "coordinator.lease.durationSeconds=0", "/lease/durationSeconds"),
        ("--set-string", "coordinator.lease.renewDeadlineSeconds=0.0", "/renewDeadlineSeconds"),
        ("--set-string", "coordinator.lease.retryPeriodSeconds=.0", "/retryPeriodSeconds"),
        ("--set-string", "coordinator.prepareTimeoutSeconds=0", "/prepareTimeoutSeconds"),
        ("--set-string", "hostNetwork.apiServer.port=0", "/hostNetwork/apiServer/port"),
        ("--set-string", "hostNetwork.apiServer.port=70000", "/hostNetwork/apiServer/port"),
        (
            "--set",
            "coordinator.lease.retryPeriodSeconds=9.9",
            "1.2 * retryPeriodSeconds (9.9) < renewDeadlineSeconds (10)",
        ),
    ],
)
def test_bad_coordinator_settings_are_refused_by_name(flag: str, setting: str, named: str) -> None:
    said = refused(flag, setting)
    assert named in said, said


def test_on_the_hosts_network_it_listens_and_is_probed_on_the_listen_address() -> None:
    objs = render(
        "--set", "hostNetwork.enabled=true",
        "--set", "hostNetwork.listenHost=127.0.0.1",
        "--set", "hostNetwork.apiServer.host=127.0.0.1",
        "--set", "hostNetwork.apiServer.port=16443",
    )  # fmt: skip
    coordinator = container(objs, "Deployment", "baton-coordinator")
    assert env(coordinator)["BATON_COORDINATOR_LLMD_LISTEN"] == "127.0.0.1:50051"
    assert env(coordinator)["BATON_COORDINATOR_HTTP_LISTEN"] == "127.0.0.1:9465"
    assert env(coordinator)["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
    assert coordinator["livenessProbe"]["tcpSocket"]["host"] == "127.0.0.1"
    deployment = find(objs, "Deployment", "baton-coordinator")
    assert deployment is not None
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0
    agent = env(container(objs, "DaemonSet", "baton-agent"))
    assert agent["BATON_AGENT_COORDINATION_ADVERTISE"] == "127.0.0.1:9464" and "POD_IP" not in agent
    assert agent["BATON_COORDINATOR"] == "127.0.0.1:50051"


@pytest.mark.parametrize(
    "where",
    [(), ("--set", "hostNetwork.enabled=true", "--set", "hostNetwork.listenHost=10.0.0.7")],
    ids=["pod network", "host network"],
)
def test_every_replicas_metrics_port_is_named_and_scraped(where: tuple[str, ...]) -> None:
    objs = render("--api-versions", "monitoring.coreos.com/v1", *where)
    monitor = find(objs, "PodMonitor", "baton-coordinator")
    deployment = find(objs, "Deployment", "baton-coordinator")
    assert monitor is not None and deployment is not None
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["path"] == "/metrics"
    coordinator = container(objs, "Deployment", "baton-coordinator")
    ports = {p["name"]: p["containerPort"] for p in coordinator["ports"]}
    assert ports[endpoint["port"]] == names.PORT_COORDINATOR
    listen = env(coordinator).get("BATON_COORDINATOR_HTTP_LISTEN")
    assert listen in (None, f"10.0.0.7:{names.PORT_COORDINATOR}"), listen
    off = render("--api-versions", "monitoring.coreos.com/v1", "--set", "coordinator.enabled=false")
    assert find(off, "PodMonitor", "baton-coordinator") is None


# Against a real API server: `lookup` sees the Secret only there.


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """etcd and kube-apiserver (no controllers, no nodes): enough for Helm to install into."""
    with api_server(tmp_path_factory, "chart-plane") as plane:
        yield plane.admin_kubeconfig


def installed_token(kubeconfig: Path) -> str:
    from kubernetes import client

    from baton.contract.kube import load_api_client

    core: Any = client.CoreV1Api(load_api_client(str(kubeconfig)))
    secret = core.read_namespaced_secret(SECRET, NAMESPACE)
    return base64.b64decode(secret.data["token"]).decode()


def test_upgrades_keep_the_token_running_agents_hold(kubeconfig: Path) -> None:
    def release(verb: str, *args: str) -> None:
        helm(verb, "baton", str(CHART), "-n", NAMESPACE, "--kubeconfig", str(kubeconfig), *args)

    release("install", "--create-namespace")
    first = installed_token(kubeconfig)
    release("upgrade", "--set", "coordinator.queuePolicy=fair")
    assert installed_token(kubeconfig) == first
    release("upgrade", "--set", f"coordinator.token.value={TOKEN}")
    assert installed_token(kubeconfig) == TOKEN
    release("upgrade")
    assert installed_token(kubeconfig) == TOKEN, "dropping the value keeps the token it set"

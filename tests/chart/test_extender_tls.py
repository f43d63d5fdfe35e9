"""The chart's `extender.tls`: kube-scheduler and the extender on mutual TLS, rendered."""

from __future__ import annotations

from typing import Any

import yaml

from tests.chart.helm import NAMESPACE, refused, render

TLS = ["--set", "kubeletPlugin=deviceplugin", "--set", "extender.tls.secretName=ext-tls"]
CLIENT = ["--set", "extender.tls.clientSecretName=sched-client"]


def _by_name(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _profile_extender(objs: list[dict[str, Any]]) -> dict[str, Any]:
    config = _by_name(objs, "ConfigMap", "baton-scheduler-config")["data"]["config.yaml"]
    (extender,) = yaml.safe_load(config)["extenders"]
    return dict(extender)


def test_mutual_tls_wires_both_ends_to_the_same_files() -> None:
    objs = render(*TLS, *CLIENT)
    extender = _profile_extender(objs)
    assert extender["urlPrefix"] == f"https://baton-extender.{NAMESPACE}.svc:9462"
    assert extender["enableHTTPS"] is True
    tls = extender["tlsConfig"]
    assert tls["serverName"] == f"baton-extender.{NAMESPACE}.svc"
    scheduler = _by_name(objs, "Deployment", "baton-scheduler")["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in scheduler["containers"][0]["volumeMounts"]}
    secrets = {v["name"]: v["secret"] for v in scheduler["volumes"] if "secret" in v}
    for path, secret, key in (
        (tls["caFile"], "ext-tls", "ca.crt"),
        (tls["certFile"], "sched-client", "tls.crt"),
        (tls["keyFile"], "sched-client", "tls.key"),
    ):
        directory, name = path.rsplit("/", 1)
        volume = secrets[mounts[directory]]
        assert volume["secretName"] == secret and {"key": key, "path": name} in volume["items"]
    pod = _by_name(objs, "Deployment", "baton-extender")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    secrets = {v["name"]: v["secret"] for v in pod["volumes"]}
    for variable, secret, key in (
        ("BATON_EXTENDER_TLS_CERT", "ext-tls", "tls.crt"),
        ("BATON_EXTENDER_TLS_KEY", "ext-tls", "tls.key"),
        ("BATON_EXTENDER_TLS_CLIENT_CA", "sched-client", "ca.crt"),
    ):
        directory, name = env[variable].rsplit("/", 1)
        volume = secrets[mounts[directory]]
        assert volume["secretName"] == secret and {"key": key, "path": name} in volume["items"]
    assert container["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert container["livenessProbe"]["failureThreshold"] == 6


def test_serving_tls_alone_asks_no_client_certificate() -> None:
    objs = render(*TLS)
    tls = _profile_extender(objs)["tlsConfig"]
    assert "certFile" not in tls and "keyFile" not in tls
    (container,) = _by_name(objs, "Deployment", "baton-extender")["spec"]["template"]["spec"][
        "containers"
    ]
    assert "BATON_EXTENDER_TLS_CLIENT_CA" not in {e["name"] for e in container["env"]}


def test_a_client_secret_without_serving_tls_is_refused_naming_both() -> None:
    said = refused("--set", "extender.tls.clientSecretName=sched-client")
    assert "extender.tls.clientSecretName needs extender.tls.secretName" in said, said


def test_without_tls_the_profile_stays_plain_http() -> None:
    extender = _profile_extender(render("--set", "kubeletPlugin=deviceplugin"))
    assert extender["urlPrefix"].startswith("http://") and "tlsConfig" not in extender

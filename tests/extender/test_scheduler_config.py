"""The KubeSchedulerConfiguration: its names match Baton's, and every verb it names is served."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from baton.contract import names
from extender.app import create_app
from extender.cache import ClusterCache
from extender.metrics import Metrics
from extender.placement import Limits
from extender.server import ServerThread
from extender.state import ClusterState
from tests.extender.builders import node, pod

SCHEDULER = Path(__file__).resolve().parents[2] / "manifests" / "scheduler"
CONFIGS = [SCHEDULER / "scheduler-config.yaml", SCHEDULER / "tls" / "scheduler-config.yaml"]
VERBS = ("filterVerb", "prioritizeVerb", "bindVerb", "preemptVerb")


def extenders(path: Path) -> list[dict[str, Any]]:
    config = yaml.safe_load(path.read_text())
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in config["profiles"]] == [names.SCHEDULER_NAME]
    return list(config["extenders"])


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(SCHEDULER)))
def test_configuration_names_baton_resources_and_service(path: Path) -> None:
    (extender,) = extenders(path)
    managed = {r["name"]: r["ignoredByScheduler"] for r in extender["managedResources"]}
    assert managed == {
        names.RESOURCE_GPU: False,
        names.RESOURCE_GPU_MEMORY: True,
        names.RESOURCE_GPU_DUTY: True,
    }
    assert extender["nodeCacheCapable"] is True
    assert extender["weight"] > 0
    assert extender["httpTimeout"].endswith("s")
    url = urlsplit(extender["urlPrefix"])
    assert url.hostname == f"baton-extender.{names.NAMESPACE}.svc"
    assert url.port == names.PORT_EXTENDER
    assert (url.scheme == "https") is bool(extender.get("enableHTTPS"))
    if url.scheme == "https":
        assert extender["tlsConfig"]["serverName"] == url.hostname
        assert extender["tlsConfig"]["caFile"]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(SCHEDULER)))
def test_kustomization_generates_the_mounted_configmap(path: Path) -> None:
    spec = yaml.safe_load((path.parent / "kustomization.yaml").read_text())
    (generator,) = spec["configMapGenerator"]
    assert generator["name"] == "baton-scheduler-config"
    assert generator["files"] == [f"config.yaml={path.name}"]
    assert spec["namespace"] == names.NAMESPACE


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(SCHEDULER)))
def test_every_verb_it_names_is_served(path: Path) -> None:
    cache = ClusterCache.filled(ClusterState(Limits(), time.monotonic), [node("n1")], [])
    bodies = {
        "filterVerb": {"Pod": pod(), "Nodes": None, "NodeNames": ["n1"]},
        "prioritizeVerb": {"Pod": pod(), "Nodes": None, "NodeNames": ["n1"]},
        "bindVerb": {"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "n1"},
        "preemptVerb": {"Pod": pod(), "NodeNameToMetaVictims": {}},
    }
    (extender,) = extenders(path)
    named = [v for v in VERBS if extender.get(v)]
    assert {"filterVerb", "prioritizeVerb", "bindVerb"} <= set(named)
    prefix = urlsplit(extender["urlPrefix"]).path.rstrip("/")
    with ServerThread(create_app(cache, None, Metrics())) as server:
        for verb in named:
            url = f"http://127.0.0.1:{server.port}{prefix}/{extender[verb]}"
            answer = httpx.post(url, content=json.dumps(bodies[verb]), timeout=10)
            assert answer.status_code == 200, (verb, answer.text)
            assert answer.headers["content-type"] == "application/json"

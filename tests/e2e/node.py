"""The simulated cluster's objects: the node under test, a spare node, the tenant pods."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from baton.contract import names
from tests.e2e.cluster import Container, Kubelet, Placement
from tests.e2e.prometheus import Prometheus
from tests.harness.fakeapi import FakeApiServer

NODE = "node-a"
SPARE_NODE = "node-b"
"""Has GPUs on paper only (no daemons): kube-scheduler has a choice, so it calls prioritize."""
GPU_MIB = 1024
GPU_SIZES_MIB = (300, GPU_MIB)
"""The node's two GPUs: tenants fit only the second, so the extender must choose it, and the
kubelet's default pick (the first free slot, on the first GPU) is right only if
GetPreferredAllocation steers it."""
TENANT_MIB = 400
"""Two tenants fit on a GPU, three do not: someone is parked at every third turn or so."""
BUDGET_MIB = 4096
TENANTS = ("grpo-a", "grpo-b", "grpo-c")
STEPS = 12
FAKE_DIR = "/var/lib/baton-fake-gpus"
"""Host path of the simulated device memory (a hostPath volume of the tenant pods)."""
TENANT_FAKE_DIR = "/run/baton-fake-gpus"


@dataclass
class Node:
    """Everything the end-to-end tests look at."""

    root: Path
    api: FakeApiServer
    kubeconfig: Path
    extender_url: str
    agent_url: str
    agent_port: int
    deviceplugin_url: str
    placements: dict[str, Placement] = field(default_factory=dict)
    containers: dict[str, Container] = field(default_factory=dict)
    outputs: dict[str, tuple[int, str, str]] = field(default_factory=dict)
    agent_status: dict[str, Any] = field(default_factory=dict)
    inventory: dict[str, Any] = field(default_factory=dict)
    status_json: dict[str, Any] = field(default_factory=dict)
    status_table: str = ""
    agent_metrics: str = ""
    kubelet: Kubelet | None = None
    prometheus: Prometheus | None = None
    finished_at: float = 0.0


def node_object(name: str, address: str, annotations: dict[str, str] | None = None) -> Any:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, names.LABEL_GPU_NODE: "true"},
            "annotations": annotations or {},
        },
        "status": {"addresses": [{"type": "InternalIP", "address": address}]},
    }


def node_pod(node: str, pod_ip: str) -> Any:
    """The agent DaemonSet's pod on `node` as the API server shows it running."""
    key, _, value = names.NODE_POD_SELECTOR.partition("=")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"baton-agent-{node}",
            "namespace": names.NAMESPACE,
            "uid": str(uuid.uuid4()),
            "labels": {key: value},
        },
        "spec": {"nodeName": node, "containers": [{"name": "agent", "image": "baton"}]},
        "status": {"phase": "Running", "podIP": pod_ip},
    }


def spare_node() -> Any:
    """What the device plugin would write on a node with one GPU cut into 8 slots."""
    gpus = [{"uuid": "GPU-spare-0", "index": 0, "model": "fake", "memoryMiB": GPU_MIB}]
    gpus[0].update(slots=8, healthy=True)
    notes = {
        names.ANNOTATION_GPUS: json.dumps(gpus),
        names.ANNOTATION_HOST_MEMORY_BUDGET: str(BUDGET_MIB),
    }
    return node_object(SPARE_NODE, "127.0.0.2", notes)


def tenant_pod(name: str) -> Any:
    """A GRPO tenant as a user writes it: Baton limits, the example loop, simulated memory."""
    env = {
        "GRPO_STEPS": str(STEPS),
        "GRPO_GENERATE_S": "0.04",
        "GRPO_SCORE_S": "0.05",
        "GRPO_TRAIN_S": "0.04",
        "GRPO_GPU_MEMORY_MIB": str(TENANT_MIB),
        names.ENV_FAKE_GPU_DIR: TENANT_FAKE_DIR,
    }
    limits = {
        names.RESOURCE_GPU: "1",
        names.RESOURCE_GPU_MEMORY: str(TENANT_MIB),
        names.RESOURCE_GPU_DUTY: "30",
        "memory": "2Gi",
        "cpu": "1",
    }
    container = {
        "name": "trainer",
        "image": "baton",
        "command": ["python", "-m", "agent.examples.grpo_loop"],
        "args": ["--acquire-timeout", "30"],
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "resources": {"limits": limits, "requests": limits},
        "volumeMounts": [{"name": "fake-gpus", "mountPath": TENANT_FAKE_DIR}],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": str(uuid.uuid4())},
        "spec": {
            "schedulerName": names.SCHEDULER_NAME,
            "containers": [container],
            "volumes": [{"name": "fake-gpus", "hostPath": {"path": FAKE_DIR}}],
        },
        "status": {"phase": "Pending"},
    }

"""What users read through the real tools: FailedScheduling events, node capacity, daemon logs."""

from __future__ import annotations

import json
import re

import pytest

from baton.contract import names
from tests.k8s.cluster import Cluster, wait_for
from tests.k8s.pods import sleeper_pod


def events_section(cluster: Cluster, namespace: str, pod: str, needle: str) -> str:
    """The pod's `kubectl describe` once its events contain `needle` (whitespace folded)."""

    def shown() -> str | None:
        text = " ".join(cluster.describe(namespace, pod).split())
        return text if needle in text else None

    return wait_for(f"{pod}'s events to say {needle!r}", shown, 60.0, every=1.0)


def unplaceable(namespace: str, name: str, **kw: object) -> dict[str, object]:
    """A sleeper pod with `kw` overriding its Baton limits."""
    pod = sleeper_pod(name, namespace)
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    for key, value in kw.items():
        resource = {"memory": "memory"}.get(key, f"baton.dev/{key.replace('_', '-')}")
        limits[resource] = str(value)
    return pod


def test_requests_that_never_fit_say_why(cluster: Cluster, namespace: str) -> None:
    cluster.apply(
        unplaceable(namespace, "too-much-memory", gpu_memory=100000),
        unplaceable(namespace, "small-limit", gpu_memory=30000, memory="1Gi"),
        unplaceable(namespace, "bad-duty", gpu_duty=150),
    )
    text = events_section(cluster, namespace, "too-much-memory", "FailedScheduling")
    assert "gpu-memory 100000 MiB exceeds every GPU on this node (81920 MiB)" in text, text
    text = events_section(cluster, namespace, "small-limit", "FailedScheduling")
    assert "container memory limit 1 GiB cannot hold the" in text, text
    text = events_section(cluster, namespace, "bad-duty", "FailedScheduling")
    assert "baton.dev/gpu-duty 150 is not above 0 and at most 100 (percent)" in text, text
    for pod in ("too-much-memory", "small-limit", "bad-duty"):
        assert cluster.pod(namespace, pod)["status"]["phase"] == "Pending"
    cluster.kubectl("delete", "pod", "-n", namespace, "--all", "--grace-period=0", "--force")


def test_full_gpus_say_which_limit_is_reached(cluster: Cluster, namespace: str) -> None:
    # Two pods on both GPUs at 45% each: 90% of each GPU's time is spoken for, 4 slots left.
    cluster.apply(*(sleeper_pod(f"busy-{i}", namespace, gpus=2, duty=45) for i in range(2)))
    for i in range(2):
        cluster.wait_phase(namespace, f"busy-{i}", {"Running"}, 60)
    cluster.apply(sleeper_pod("over-duty", namespace, duty=30))
    text = events_section(cluster, namespace, "over-duty", "FailedScheduling")
    assert "GPU-fake-" in text and "summed duty would be 120 percent > 100 percent" in text, text
    assert "%!" not in text, "kube-scheduler took a reason for a format string"
    cluster.kubectl("delete", "pod", "-n", namespace, "over-duty", "--grace-period=0", "--force")
    # Two more on both GPUs take the last slots: kube-scheduler's own count says so first.
    cluster.apply(*(sleeper_pod(f"more-{i}", namespace, gpus=2, duty=5) for i in range(2)))
    for i in range(2):
        cluster.wait_phase(namespace, f"more-{i}", {"Running"}, 60)
    cluster.apply(sleeper_pod("no-slot", namespace, duty=1))
    text = events_section(cluster, namespace, "no-slot", "FailedScheduling")
    assert "Insufficient baton.dev/gpu" in text, text
    cluster.kubectl("delete", "pod", "-n", namespace, "--all", "--grace-period=0", "--force")


def test_node_shows_capacity_and_inventory(cluster: Cluster) -> None:
    text = cluster.kubectl("describe", "node", cluster.node_name)
    assert re.search(r"Capacity:(.|\n)*baton.dev/gpu:\s+8", text), text
    assert re.search(r"Allocatable:(.|\n)*baton.dev/gpu:\s+8", text), text
    node = cluster.get("node", cluster.node_name)
    gpus = json.loads(node["metadata"]["annotations"][names.ANNOTATION_GPUS])
    assert [(g["memoryMiB"], g["slots"], g["healthy"]) for g in gpus] == [(81920, 4, True)] * 2
    assert node["metadata"]["annotations"][names.ANNOTATION_HOST_MEMORY_BUDGET] == "131072"


@pytest.mark.parametrize(
    ("app", "line"),
    [
        ("baton-agent", "agent ready: socket /run/baton/agent.sock"),
        ("baton-deviceplugin", "registered"),
        ("baton-extender", "serving on http://127.0.0.1:9462"),
    ],
)
def test_daemon_logs_read_well(cluster: Cluster, app: str, line: str) -> None:
    pod = cluster.daemon_pod(app)["metadata"]["name"]
    logs = cluster.logs(names.NAMESPACE, pod)
    assert line in logs, logs
    assert "Traceback" not in logs, logs
    assert "forbidden" not in logs.lower(), logs

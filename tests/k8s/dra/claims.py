"""DRA pods as a user writes them: a claim template asking memory and duty, or a plain limit."""

from __future__ import annotations

from typing import Any

from baton.contract import names
from tests.k8s.pods import REPORT, tenant_pod

GIB = 1 << 30


def claim_template(
    name: str, namespace: str, memory_gib: int, duty: int, gpu_index: int | None = None
) -> dict[str, Any]:
    """A ResourceClaimTemplate asking a share of one GPU (of GPU `gpu_index` if given)."""
    request: dict[str, Any] = {
        "deviceClassName": names.DRA_DEVICE_CLASS,
        "capacity": {"requests": {"memory": f"{memory_gib}Gi", "duty": str(duty)}},
    }
    if gpu_index is not None:
        expression = f'device.attributes["{names.DRA_DRIVER}"].index == {gpu_index}'
        request["selectors"] = [{"cel": {"expression": expression}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}},
    }


def claim_pod(name: str, namespace: str, template: str, script: str = "") -> dict[str, Any]:
    """A pod whose one container uses a claim from `template`; reports its env, then sleeps."""
    pod = _pod(name, namespace, script or REPORT + "exec sleep 3600", {})
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    return pod


def limit_pod(name: str, namespace: str, script: str = "") -> dict[str, Any]:
    """A pod asking only `baton.dev/gpu: 1`, as on the device-plugin path."""
    return _pod(name, namespace, script or REPORT + "exec sleep 3600", {names.RESOURCE_GPU: "1"})


def _pod(name: str, namespace: str, script: str, limits: dict[str, str]) -> dict[str, Any]:
    container = {
        "name": "trainer",
        "image": "baton:local",
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", script],
        "resources": {"limits": limits, "requests": {"cpu": "10m", "memory": "32Mi"}},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "schedulerName": names.SCHEDULER_NAME,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
        },
    }


def claim_tenant(name: str, namespace: str, template: str, steps: int = 6) -> dict[str, Any]:
    """The GRPO tenant of tests/k8s (reports its env, takes turns, verifies its memory) with a
    claim from `template` instead of Baton limits."""
    pod = tenant_pod(name, namespace, steps=steps, memory_limit=None)
    container = pod["spec"]["containers"][0]
    container["resources"]["limits"] = {}
    container["resources"]["claims"] = [{"name": "gpu"}]
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
    return pod

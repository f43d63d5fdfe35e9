"""Tenant pods as a user writes them: Baton limits, schedulerName, the example loop."""

from __future__ import annotations

from typing import Any

from baton.contract import names

FAKE_DIR = "/run/baton-fake-gpus"
"""The simulated device memory's host directory (manifests/overlays/local/node-fake-gpus.yaml)."""
REPORT = (
    "echo TENANT_UID=$(id -u); "
    "env | grep -E '^(BATON_|NVIDIA_)' | sort; "
    "grep ' /run/baton ' /proc/self/mountinfo | sed 's/^/mount: /'; "
    "sed 's/^/cgroup: /' /proc/self/cgroup | head -2; "
)


def tenant_pod(
    name: str,
    namespace: str,
    *,
    steps: int = 6,
    memory_mib: int = 30000,
    duty: int = 30,
    gpus: int = 1,
    phase_s: float = 0.05,
    memory_limit: str | None = "40Gi",
) -> dict[str, Any]:
    """A GRPO tenant that reports its environment, then takes turns and verifies its memory."""
    env = {
        "GRPO_STEPS": str(steps),
        "GRPO_GENERATE_S": str(phase_s),
        "GRPO_SCORE_S": str(phase_s),
        "GRPO_TRAIN_S": str(phase_s),
        "GRPO_GPU_MEMORY_MIB": str(memory_mib),
        names.ENV_FAKE_GPU_DIR: FAKE_DIR,
    }
    script = REPORT + "exec python -m agent.examples.grpo_loop --acquire-timeout 60"
    return _pod(name, namespace, script, env, _limits(gpus, memory_mib, duty, memory_limit))


def sleeper_pod(
    name: str, namespace: str, *, gpus: int = 1, duty: int | None = None, memory_mib: int = 1024
) -> dict[str, Any]:
    """A pod that holds its Baton slots (and reports its environment) until deleted."""
    return _pod(name, namespace, REPORT + "exec sleep 3600", {}, _limits(gpus, memory_mib, duty))


def _limits(gpus: int, memory_mib: int, duty: int | None, memory: str | None = None) -> Any:
    limits = {names.RESOURCE_GPU: str(gpus), names.RESOURCE_GPU_MEMORY: str(memory_mib)}
    if duty is not None:
        limits[names.RESOURCE_GPU_DUTY] = str(duty)
    if memory:
        limits["memory"] = memory
    return limits


def _pod(name: str, namespace: str, script: str, env: dict[str, str], limits: Any) -> Any:
    container = {
        "name": "trainer",
        "image": "baton:local",
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", script],
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "resources": {"limits": limits, "requests": {"cpu": "10m", "memory": "32Mi"}},
        "volumeMounts": [{"name": "fake-gpus", "mountPath": FAKE_DIR}],
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
            "volumes": [{"name": "fake-gpus", "hostPath": {"path": FAKE_DIR}}],
        },
    }


def report(logs: str) -> dict[str, str]:
    """The environment lines a tenant printed first (KEY=VALUE)."""
    found = {}
    for line in logs.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.replace("_", "").isupper() and key.isidentifier():
            found[key] = value
    return found


def namespace_obj(name: str) -> dict[str, Any]:
    """A namespace object."""
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}

"""A dict of API paths standing in for the API server (proxy answers included), and the
documents Baton's agents and extender answer, shaped as they are."""

from __future__ import annotations

from typing import Any

from commands.kubectl.api import Forbidden, NotFound, PluginError, agent_status_path, inventory_path

GPU_A, GPU_B = "GPU-fake-n1-0", "GPU-fake-n1-1"
GIB = 1 << 30


class DictApi:
    """GET answers from `routes` (path → document, or a PluginError to raise)."""

    namespace = "default"

    def __init__(self, routes: dict[str, Any]) -> None:
        self.routes = routes
        self.asked: list[tuple[str, dict[str, str]]] = []

    def get(self, path: str, **params: str) -> Any:
        self.asked.append((path, params))
        if path not in self.routes:
            raise NotFound(f"not found: {path}")
        answer = self.routes[path]
        if isinstance(answer, PluginError):
            raise answer
        return answer


def agent_pod(node: str, name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "baton-system"},
        "spec": {"nodeName": node},
        "status": {"phase": "Running"},
    }


def agent_status() -> dict[str, Any]:
    """Node n1: ml/a holds GPU A, ml/b waits on it, ops/c is parked on GPU B."""
    return {
        "gpus": {
            GPU_A: {
                "holder": "ml/a",
                "held_s": 1.5,
                "queue": [
                    {"tenant_id": "ml/b", "waited_s": 0.7, "why": "position 1 (behind ml/a)"}
                ],
                "tenants": ["ml/a", "ml/b"],
                "duty_last_minute": 0.4,
            },
            GPU_B: {"holder": None, "queue": [], "tenants": ["ops/c"], "duty_last_minute": 0.0},
        },
        "tenants": {
            "ml/a": {"gpus": [GPU_A], "gpu_duty": 30},
            "ml/b": {"gpus": [GPU_A], "gpu_duty": 50},
            "ops/c": {"gpus": [GPU_B], "gpu_duty": 100},
        },
        "residency": {
            "parked_bytes": 2 * GIB,
            "host_memory_budget_bytes": 8 * GIB,
            "tenants": {
                "ml/a": {"gpus": {GPU_A: "resident"}},
                "ml/b": {"gpus": {GPU_A: "resident"}},
                "ops/c": {"gpus": {GPU_B: "parked"}},
            },
        },
        "accounting": {
            "gpu_seconds": [
                ["ml/a", "ml", 0, 10.0],
                ["ml/b", "ml", 0, 5.0],
                ["ops/c", "ops", 1, 2.0],
            ],
            "parked_byte_seconds": [["ops/c", "ops", 1, 4.0 * GIB]],
        },
    }


def cluster_routes() -> dict[str, Any]:
    """One node n1 with its agent pod and the extender's inventory."""
    return {
        "/api/v1/namespaces/baton-system/pods": {"items": [agent_pod("n1", "baton-agent-x")]},
        agent_status_path("baton-agent-x"): agent_status(),
        inventory_path(): {
            "synced": True,
            "nodes": [
                {
                    "name": "n1",
                    "hostMemoryBudgetMiB": 8192,
                    "gpus": [
                        {"uuid": GPU_A, "index": 0, "healthy": True, "tenants": []},
                        {"uuid": GPU_B, "index": 1, "healthy": True, "tenants": []},
                    ],
                }
            ],
        },
    }


FORBIDDEN_PROXY = Forbidden(
    'forbidden: pods "baton-agent-x" is forbidden: User "bob" cannot get resource "pods/proxy"'
    ' in API group "" in the namespace "baton-system"'
)

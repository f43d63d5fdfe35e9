"""Every node's agent and the extender's inventory, read through the API server's proxy."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from baton.contract.names import NAMESPACE, NODE_POD_SELECTOR
from commands.kubectl.api import (
    Api,
    Forbidden,
    NoAnswer,
    NotFound,
    PluginError,
    Unreachable,
    agent_status_path,
    inventory_path,
)
from commands.status.cluster import AgentAnswer, AgentPod, cluster_document, node_agent_pods


def node_agents(api: Api, namespace: str = NAMESPACE) -> dict[str, AgentPod]:
    """Node name → its running agent pod, one terminating where none other runs
    (`node_agent_pods`)."""
    found = api.get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=NODE_POD_SELECTOR)
    return node_agent_pods(found.get("items") or [])


def agent_pods(api: Api, namespace: str = NAMESPACE) -> dict[str, str]:
    """Node name → the name of its running agent pod (`node_agents`)."""
    return {node: pod.name for node, pod in node_agents(api, namespace).items()}


def no_agents(namespace: str) -> str:
    """What `status` and `usage` say when the namespace has no running agent pod."""
    return (
        f"no running Baton agent pod ({NODE_POD_SELECTOR}) in namespace {namespace}: "
        "is Baton installed there (--baton-namespace)?"
    )


def read_agent(api: Api, pod: str, namespace: str = NAMESPACE) -> AgentAnswer:
    """An agent's /v1/status, or a sentence saying why it could not be read (Forbidden
    propagates: the user lacks a permission, which no other node would change)."""
    try:
        answer = api.get(agent_status_path(pod, namespace))
    except Forbidden:
        raise
    except NoAnswer as err:  # the API server answers (it listed the pods); the agent does not
        return (
            f"cannot read agent {pod}: no answer within {err.timeout_s:g} s through the API "
            "server's pod proxy (is its node down or cut off?)"
        )
    except PluginError as err:
        return f"cannot read agent {pod}: {err}"
    return dict(answer) if isinstance(answer, dict) else f"agent {pod} sent no JSON object"


def read_agents(
    api: Api, pods: Mapping[str, str], namespace: str = NAMESPACE
) -> dict[str, AgentAnswer]:
    """Node → its agent's answer (`read_agent`), every agent asked at once: a node down costs
    one request timeout, not one per node down (Forbidden propagates)."""
    nodes = sorted(pods)
    with ThreadPoolExecutor(max_workers=min(32, len(nodes) or 1)) as pool:
        answers = pool.map(lambda node: read_agent(api, pods[node], namespace), nodes)
        return dict(zip(nodes, answers, strict=True))


def read_inventory(api: Api, pods: Mapping[str, str], namespace: str = NAMESPACE) -> Any:
    """The extender's inventory; without an extender, the agents' nodes alone."""
    try:
        return _inventory(api, namespace)
    except Forbidden:
        raise
    except PluginError as err:
        nodes = [{"name": node, "gpus": []} for node in sorted(pods)]
        return {"synced": None, "nodes": nodes, "error": f"extender: {err}"}


def _inventory(api: Api, namespace: str) -> Any:
    """The inventory over plain HTTP, else over HTTPS where the API server's proxy got no
    answer from the extender over HTTP (the chart's `extender.tls`): the plain error if neither
    answers."""
    try:
        return api.get(inventory_path(namespace))
    except (Forbidden, NotFound, NoAnswer, Unreachable):
        raise
    except PluginError as plain:
        try:
            return api.get(inventory_path(namespace, https=True))
        except Forbidden:
            raise
        except PluginError:
            raise plain from None


def read_cluster(api: Api, namespace: str = NAMESPACE) -> dict[str, Any]:
    """`commands.status.cluster` document for every node, each GPU's entitled duty added."""
    agents = node_agents(api, namespace)
    pods = {node: pod.name for node, pod in agents.items()}
    inventory = read_inventory(api, pods, namespace)
    names = {n["name"] for n in inventory.get("nodes", [])}
    for node in sorted(set(pods) - names):
        inventory["nodes"].append({"name": node, "gpus": []})
    answers: dict[str, AgentAnswer] = dict.fromkeys(
        (n["name"] for n in inventory["nodes"]), "no running agent pod"
    )
    answers.update(read_agents(api, {n: p for n, p in pods.items() if n in answers}, namespace))
    urls = {node: f"pod {namespace}/{pod}" for node, pod in pods.items()}
    terminating = {node for node, pod in agents.items() if pod.terminating}
    document = cluster_document(inventory, answers, urls, terminating)
    if inventory.get("error"):
        document["extender_error"] = inventory["error"]
    if not pods:
        document["agents_error"] = no_agents(namespace)
    for node in document["nodes"]:  # an agent unread: its tenants' duty is unknown, not 0
        status = answers.get(node["name"])
        tenants = status.get("tenants", {}) if isinstance(status, dict) else None
        for gpu in node["gpus"]:
            gpu["duty_entitled"] = None if tenants is None else entitled(tenants, gpu["uuid"])
    return document


def entitled(tenants: Mapping[str, Any], gpu: str) -> float:
    """The summed `gpu-duty` of the tenants on `gpu`, as a share (1.0 = the whole GPU)."""
    duty = sum(int(t.get("gpu_duty") or 0) for t in tenants.values() if gpu in t.get("gpus", []))
    return round(duty / 100, 4)

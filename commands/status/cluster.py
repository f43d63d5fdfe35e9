"""`baton status` across nodes: the extender's inventory joined with every node's agent.

The extender's `/v1/inventory` names the nodes, their GPUs and the pods placed on each; each
node's agent (`/v1/status`) says who holds each GPU, who waits, who is resident or parked and
how busy the GPU was over the last minute. `cluster_document` joins the two (pure); the fetch
functions are the thin HTTP and Kubernetes shell around it.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Collection, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from agent.parking.backends.base import Residency
from baton.contract.names import NAMESPACE, NODE_POD_SELECTOR
from commands.status.shares import namespace_shares

AgentAnswer = dict[str, Any] | str
"""An agent's /v1/status document, or why it could not be read."""
_PARKED = {Residency.PARKED, Residency.PARKING}


def gpu_summary(uuid: str, status: Mapping[str, Any]) -> dict[str, Any]:
    """One GPU as its agent sees it: holder, queue, tenants resident and parked, duty."""
    info = status.get("gpus", {}).get(uuid)
    if info is None:
        return {"holder": None, "queue": [], "tenants": [], "resident": [], "parked": []}
    where = {
        tenant: entry.get("gpus", {}).get(uuid, "")
        for tenant, entry in (status.get("residency") or {}).get("tenants", {}).items()
    }
    tenants = list(info.get("tenants", []))
    return {
        "holder": info.get("holder"),
        "fencing_token": info.get("fencing_token"),
        "queue": [q["tenant_id"] for q in info.get("queue", [])],
        "tenants": tenants,
        "resident": [t for t in tenants if where.get(t) == Residency.RESIDENT],
        "parked": [t for t in tenants if where.get(t) in _PARKED],
        "duty_last_minute": info.get("duty_last_minute"),
        "busy_seconds": info.get("busy_seconds"),
    }


def node_summary(
    name: str,
    inventory_node: Mapping[str, Any] | None,
    agent: AgentAnswer | None,
    url: str,
    terminating: bool = False,
) -> dict[str, Any]:
    """One node: the extender's GPUs and pods, each joined with what the agent says
    (`terminating`: read from an agent pod shutting down, the node running no other)."""
    status = agent if isinstance(agent, dict) else {}
    residency = status.get("residency") or {}
    inv_gpus = list((inventory_node or {}).get("gpus", []))
    uuids = [g["uuid"] for g in inv_gpus]
    uuids += [u for u in status.get("gpus", {}) if u not in uuids]
    by_uuid = {g["uuid"]: g for g in inv_gpus}
    gpus = []
    for uuid in uuids:
        inv = by_uuid.get(uuid, {})
        gpus.append(
            {
                "uuid": uuid,
                "index": inv.get("index"),
                "healthy": inv.get("healthy"),
                "pods": [t["pod"] for t in inv.get("tenants", [])],
                **gpu_summary(uuid, status),
            }
        )
    budget_mib = (inventory_node or {}).get("hostMemoryBudgetMiB")
    return {
        "name": name,
        "agent": url,
        "error": agent if isinstance(agent, str) else None,
        "agent_terminating": terminating,
        "problem": (inventory_node or {}).get("problem"),
        "parked_bytes": residency.get("parked_bytes"),
        "host_memory_budget_bytes": residency.get("host_memory_budget_bytes"),
        "annotated_budget_mib": budget_mib,
        "gpus": gpus,
        "namespaces": namespace_shares(status),
    }


def troubles(node: Mapping[str, Any]) -> list[str]:
    """What keeps a node of the document from being shown whole: its agent unread or shutting
    down, and the extender's complaint about its annotations."""
    found = [node["error"]] if node.get("error") else []
    if node.get("agent_terminating"):
        found.append(f"{TERMINATING} ({node.get('agent') or 'its agent'})")
    return found + ([f"extender: {node['problem']}"] if node.get("problem") else [])


def cluster_document(
    inventory: Mapping[str, Any],
    agents: Mapping[str, AgentAnswer],
    urls: Mapping[str, str],
    terminating: Collection[str] = (),
) -> dict[str, Any]:
    """Every node of the inventory with its agent's view (`agents`, `urls` keyed by node;
    `terminating`: the nodes whose agent pod read is shutting down)."""
    nodes = [
        node_summary(
            n["name"], n, agents.get(n["name"]), urls.get(n["name"], ""), n["name"] in terminating
        )
        for n in inventory.get("nodes", [])
    ]
    return {"synced": inventory.get("synced"), "nodes": nodes}


def single_agent_document(status: Mapping[str, Any], url: str) -> dict[str, Any]:
    """One agent read directly (no inventory): its GPUs only."""
    return {"synced": None, "nodes": [node_summary("", None, dict(status), url)]}


def read_json(url: str, timeout: float = 5.0) -> Any:
    """GET `url` as JSON (urllib errors propagate)."""
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return json.load(reply)


def read_agent(url: str, timeout: float = 3.0) -> AgentAnswer:
    """An agent's /v1/status, or a sentence saying why it could not be read."""
    status_url = f"{url.rstrip('/')}/v1/status"
    try:
        document = read_json(status_url, timeout)
    except urllib.error.HTTPError as exc:
        return f"{status_url} answered HTTP {exc.code} {exc.reason}: is {url} an agent's address?"
    except http.client.BadStatusLine as exc:
        began = str(exc.args[0] if exc.args else "")[:24]
        return f"{url} did not answer in HTTP (it began {began!r}): is it an agent's HTTP port?"
    except http.client.HTTPException as exc:
        return f"the agent at {url} gave no whole HTTP answer ({exc!r})"
    except json.JSONDecodeError as exc:
        return f"{status_url} answered no JSON: is {url} an agent's address? ({exc})"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return f"cannot reach the agent at {url}: {getattr(exc, 'reason', exc)}"
    return dict(document) if isinstance(document, dict) else f"{url} sent no JSON object"


TERMINATING = "agent pod terminating: shown as it shuts down, no other agent pod runs here yet"
"""A node's note when the agent read is a pod being deleted (it serves until it stops)."""


class AgentPod(NamedTuple):
    """The agent pod read on a node."""

    name: str
    ip: str | None
    terminating: bool
    """Being deleted (a rolling update, a drain): it still serves until it has stopped."""


def node_agent_pods(pods: Iterable[Mapping[str, Any]]) -> dict[str, AgentPod]:
    """Node → its agent pod (API JSON `pods`) to read: a running one, else one running but
    terminating (it answers while it shuts down gracefully)."""
    found: dict[str, AgentPod] = {}
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or status.get("phase") != "Running":
            continue
        this = AgentPod(
            meta.get("name", ""), status.get("podIP"), bool(meta.get("deletionTimestamp"))
        )
        if node not in found or (found[node].terminating and not this.terminating):
            found[node] = this
    return found


class ClusterUnreadable(RuntimeError):
    """The cluster's API could not be read, in one line: no kubeconfig, no permission, no
    answer."""


def agent_addresses(
    kubeconfig: str | None, namespace: str = NAMESPACE, timeout: float = 10.0
) -> tuple[dict[str, str], set[str]]:
    """Where each node's agent listens: its node pod's IP (the agent pods in `namespace`, where
    Baton is installed; `node_agent_pods`), else the node's InternalIP; and the nodes whose
    agent pod is terminating."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    from baton.contract.kube import KubeConfigError, load_api_client, status_message

    try:
        with load_api_client(kubeconfig) as api_client:
            host = api_client.configuration.host
            core = client.CoreV1Api(api_client)
            try:
                nodes = core.list_node(_request_timeout=timeout).items
                listed = core.list_namespaced_pod(
                    namespace, label_selector=NODE_POD_SELECTOR, _request_timeout=timeout
                ).items
                pods = [api_client.sanitize_for_serialization(pod) for pod in listed]
            except ApiException as err:
                said = status_message(err.body) or err.reason
                raise ClusterUnreadable(
                    f"the API server at {host} answered {err.status}: {said}"
                ) from None
            except (HTTPError, OSError) as err:
                why = getattr(err, "reason", None) or err
                raise ClusterUnreadable(f"cannot reach the API server at {host}: {why}") from None
    except KubeConfigError as err:
        raise ClusterUnreadable(str(err)) from None
    found: dict[str, str] = {}
    for node in nodes:
        addresses = (node.status.addresses if node.status else None) or []
        internal = [a.address for a in addresses if a.type == "InternalIP"]
        name = node.metadata.name if node.metadata else None
        if name and (internal or addresses):
            found[name] = (internal or [addresses[0].address])[0]
    terminating = set()
    for node_name, pod in node_agent_pods(pods).items():
        if pod.ip:
            found[node_name] = pod.ip
        if pod.terminating:
            terminating.add(node_name)
    return found, terminating


def read_cluster(
    extender_url: str,
    addresses: Mapping[str, str],
    agent_port: int,
    terminating: Collection[str] = (),
) -> dict[str, Any]:
    """The inventory from the extender, then every listed node's agent, in parallel
    (`terminating`: the nodes whose agent pod is shutting down)."""
    inventory = read_json(f"{extender_url.rstrip('/')}/v1/inventory")
    names = [n["name"] for n in inventory.get("nodes", [])]
    urls = {n: f"http://{addresses.get(n, n)}:{agent_port}" for n in names}
    with ThreadPoolExecutor(max_workers=min(32, len(names) or 1)) as pool:
        answers = dict(zip(names, pool.map(read_agent, [urls[n] for n in names]), strict=True))
    return cluster_document(inventory, answers, urls, terminating)

"""`kubectl baton why POD`: why a pod waits, in one answer — the scheduler's reason while it is
Pending (with DRA's numbers when only "cannot allocate all claims" was said), the agent's `why`
while it waits for a turn."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from baton.contract.names import NAMESPACE
from commands.kubectl.agents import agent_pods, read_agent
from commands.kubectl.api import Api, NotFound, PluginError
from commands.kubectl.dra import DRA_REFUSAL, dra_shortfall


def why(api: Api, namespace: str, name: str, baton_namespace: str = NAMESPACE) -> dict[str, Any]:
    """{"pod", "phase", "node", "stage", "reasons": [sentences]}."""
    pod = api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    answer: dict[str, Any] = {
        "pod": f"{namespace}/{name}",
        "phase": status.get("phase"),
        "node": spec.get("nodeName"),
    }
    if not spec.get("nodeName"):
        events = pod_events(api, pod)
        reason = scheduler_reason(pod, events)
        reasons = [reason] if reason else missing_claims(api, pod, events)
        reasons = reasons or ["not scheduled yet: the scheduler has said nothing"]
        if reason and DRA_REFUSAL in reason:
            reasons += dra_numbers(api, pod)
        return {**answer, "stage": "scheduling", "reasons": reasons}
    if status.get("phase") in ("Succeeded", "Failed"):
        return {**answer, "stage": "done", "reasons": [f"the pod has ended ({status['phase']})"]}
    return {**answer, "stage": "turn", "reasons": agent_reasons(api, pod, baton_namespace)}


def dra_numbers(api: Api, pod: Mapping[str, Any]) -> list[str]:
    """DRA's numbers behind its refusal, or why they are not shown (a user who may read the pod
    but not every namespace's claims still gets the scheduler's reason)."""
    try:
        return dra_shortfall(api, pod)
    except PluginError as err:
        return [f"DRA's numbers per device are not shown: {err}"]


def pod_events(api: Api, pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pod's events, oldest first (none when they cannot be read)."""
    meta = pod["metadata"]
    selector = f"involvedObject.name={meta['name']},involvedObject.uid={meta.get('uid', '')}"
    try:
        events = api.get(f"/api/v1/namespaces/{meta['namespace']}/events", fieldSelector=selector)
    except PluginError:
        events = {}
    found = list(events.get("items") or [])
    found.sort(key=last_seen)
    return found


def last_seen(event: Mapping[str, Any]) -> datetime:
    """When an event was last seen: a repeated one that kube-scheduler records (events.k8s.io)
    keeps it in `series`, one of the older API in `lastTimestamp`; else when first seen."""
    series = event.get("series") or {}
    when = series.get("lastObservedTime") or event.get("lastTimestamp") or event.get("eventTime")
    try:
        seen = datetime.fromisoformat(str(when))
    except ValueError:
        seen = datetime.min
    return seen if seen.tzinfo else seen.replace(tzinfo=UTC)


def scheduler_reason(pod: Mapping[str, Any], events: list[dict[str, Any]]) -> str | None:
    """The latest FailedScheduling event's message, else the PodScheduled condition's."""
    failed = [e for e in events if e.get("reason") == "FailedScheduling"]
    if failed:
        latest = failed[-1]
        return f"{latest.get('source', {}).get('component') or 'scheduler'}: {latest['message']}"
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return f"scheduler: {condition.get('message') or condition.get('reason')}"
    return None


def missing_claims(api: Api, pod: Mapping[str, Any], events: list[dict[str, Any]]) -> list[str]:
    """The claims a pod names that do not exist: kube-scheduler holds such a pod back before it
    tries it, and says nothing."""
    namespace = pod["metadata"]["namespace"]
    made = {
        s.get("name"): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    refused = [e["message"] for e in events if e.get("reason") == "FailedResourceClaimCreation"]
    reasons = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        name, template = entry.get("resourceClaimName"), entry.get("resourceClaimTemplateName")
        if template and entry.get("name") not in made:
            why = refused[-1] if refused else "the resource claim controller has not made it"
            reasons.append(f"waits for the claim from template {namespace}/{template}: {why}")
            continue
        name = name or made.get(entry.get("name"))
        if not name:
            continue  # the controller found no claim needed
        try:
            api.get(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}")
        except NotFound:
            reasons.append(f"waits for claim {namespace}/{name}, which does not exist")
        except PluginError:
            continue
    return reasons


def agent_reasons(api: Api, pod: Mapping[str, Any], baton_namespace: str) -> list[str]:
    """What the node's agent says about this pod's turn."""
    node = pod["spec"]["nodeName"]
    tenant = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
    agent = agent_pods(api, baton_namespace).get(node)
    if agent is None:
        return [f"no running Baton agent on node {node}"]
    status = read_agent(api, agent, baton_namespace)
    if isinstance(status, str):
        return [status]
    return tenant_reasons(status, tenant, node)


def tenant_reasons(status: Mapping[str, Any], tenant: str, node: str) -> list[str]:
    """Per GPU of `tenant`: holding, waiting (the agent's why), or idle."""
    if tenant not in (status.get("tenants") or {}):
        return [
            f"the agent on {node} does not know {tenant}: it asks no Baton GPU, or it has not "
            "registered yet"
        ]
    reasons = []
    for gpu, info in sorted((status.get("gpus") or {}).items()):
        if tenant not in info.get("tenants", []):
            continue
        waiting = [q for q in info.get("queue", []) if q.get("tenant_id") == tenant]
        if info.get("holder") == tenant:
            reasons.append(f"{gpu}: holds the turn ({info.get('held_s') or 0:.1f} s so far)")
        elif waiting:
            w = waiting[0]
            reasons.append(f"{gpu}: waits {w.get('waited_s', 0):.1f} s: {w.get('why')}")
        else:
            reasons.append(f"{gpu}: not asking for a turn (holder: {info.get('holder') or 'none'})")
    return reasons or [f"{tenant} has no GPU on {node}'s agent"]

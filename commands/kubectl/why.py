"""`kubectl baton why POD`: why a pod waits, in one answer — the scheduler's reason while it is
Pending (with DRA's numbers when only "cannot allocate all claims" was said), the agent's `why`
while it waits for a turn (the cluster coordinator's for a pod of a job waiting for it)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from baton.contract.names import NAMESPACE, job_of_labels
from commands.kubectl.agents import agent_pods, read_agent
from commands.kubectl.api import Api, NotFound, PluginError
from commands.kubectl.dra import DRA_REFUSAL, dra_shortfall
from commands.kubectl.jobs import NoCoordinator, read_jobs


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
    """What the node's agent says about this pod's turn; for a pod of a job asking for its turn
    of the cluster coordinator (it waits there, not in its node's queue), the coordinator's."""
    node = pod["spec"]["nodeName"]
    namespace = pod["metadata"]["namespace"]
    tenant = f"{namespace}/{pod['metadata']['name']}"
    agent = agent_pods(api, baton_namespace).get(node)
    if agent is None:
        return [f"no running Baton agent on node {node}"]
    status = read_agent(api, agent, baton_namespace)
    if isinstance(status, str):
        return [status]
    labels = ((status.get("tenants") or {}).get(tenant) or {}).get("labels") or {}
    job = job_of_labels(labels)
    if job and not on_node(status, tenant):
        turns = job_reasons(api, baton_namespace, namespace, job)
        if turns:
            return turns + tenant_reasons(status, tenant, node, elsewhere=True)
    return tenant_reasons(status, tenant, node)


def on_node(status: Mapping[str, Any], tenant: str) -> bool:
    """Whether `tenant` holds or waits for a turn of its node's agent."""
    return any(
        info.get("holder") == tenant
        or any(q.get("tenant_id") == tenant for q in info.get("queue") or [])
        for info in (status.get("gpus") or {}).values()
    )


def job_reasons(api: Api, baton_namespace: str, namespace: str, job: str) -> list[str]:
    """The cluster coordinator's turns of `namespace`'s `job` (each of its groups'): held,
    being prepared or waited for, where; none where no coordinator runs or the job asks none."""
    key = f"{namespace}/{job}"
    try:
        rows = read_jobs(api, baton_namespace, namespace)["jobs"]
    except NoCoordinator:
        return []
    except PluginError as err:  # the agent's view still stands below it
        return [f"job {key} takes its turns through the cluster coordinator, not read: {err}"]
    return [job_line(row) for row in rows if row["job"].partition("@")[0] == key]


def job_line(row: Mapping[str, Any]) -> str:
    """One of `read_jobs`'s rows as a sentence."""
    job, nodes, seconds = row["job"], ", ".join(row["nodes"]) or "no node", row["seconds"] or 0
    if row["state"] == "holding":
        return f"job {job} holds its turn on {nodes} ({seconds:.1f} s so far)"
    if row["state"] == "preparing":
        return f"job {job}'s turn is being prepared on {nodes} ({seconds:.1f} s since it asked)"
    return (
        f"job {job} waits {seconds:.1f} s for its turn on {nodes}, in the cluster coordinator's"
        " queue (kubectl baton jobs)"
    )


def tenant_reasons(
    status: Mapping[str, Any], tenant: str, node: str, elsewhere: bool = False
) -> list[str]:
    """Per GPU of `tenant`: holding, waiting (the agent's why), or idle (`elsewhere`: its turn is
    asked for elsewhere, its job's of the cluster coordinator)."""
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
        elif elsewhere:
            reasons.append(f"{gpu}: held by {info.get('holder') or 'no one'} now")
        else:
            reasons.append(f"{gpu}: not asking for a turn (holder: {info.get('holder') or 'none'})")
    return reasons or [f"{tenant} has no GPU on {node}'s agent"]

"""What the coordinator knows of the cluster: jobs, their member pods, and the nodes' agents.

Pure but for a lock: the reflectors (`baton.contract.reflector`) feed `PodStore` and `NodeStore`
from their threads, and the coordinator reads `ClusterView` on its event loop. A job is the pods
of one namespace that share `baton.dev/job` (or llm-d's `timeslice.io/job-id`); a member is such
a pod bound to a node with GPUs: those Baton assigned it, or, where its annotations say none (a
pod on a DRA node), every GPU of its node. A job's turn on an llm-d group covers the members
labelled `timeslice.io/group=<group>` or on nodes labelled `group.timeslice.io/<group>`; with no
group, every member.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from baton.contract.annotations import AnnotationError, decode_gpus, pod_assignment
from baton.contract.names import (
    ANNOTATION_AGENT_COORDINATION,
    ANNOTATION_GPUS,
    LABEL_LLMD_GROUP,
    job_of_labels,
)
from baton.contract.podask import RequestError, parse_pod_request
from baton.contract.reflector import WatchEvent

NODE_GROUP_PREFIX = "group.timeslice.io/"
"""llm-d's node label naming a group whose accelerators the node's GPUs are."""
_DONE = ("Succeeded", "Failed")


class PlanError(Exception):
    """A job's turn cannot be planned now; the message says what is missing."""


class UnknownJob(PlanError):
    """No pod carries that job (NOT_FOUND)."""


class UnknownGroup(PlanError):
    """No member of the job is in that group (NOT_FOUND)."""


@dataclass(frozen=True)
class Member:
    """One pod of a job, bound to a node (or not yet: `node` is "" until it is scheduled)."""

    pod: str
    """namespace/name"""
    node: str
    gpus: tuple[str, ...]
    """Its GPUs on its node; empty when its annotations name none (the node's GPUs then count)."""
    group: str = ""
    duty: int = 100
    tier: int = 0
    uses_gpus: bool = True
    """False for a pod that asks for no Baton GPU and claims no device (a job's CPU-only pod,
    its driver loop): no node's agent counts it, so it takes no part in the job's turns."""


@dataclass(frozen=True)
class Node:
    """A node as the coordinator needs it: where its agent listens, its GPUs, its groups."""

    name: str
    address: str = ""
    gpus: tuple[str, ...] = ()
    groups: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Plan:
    """One job turn: what each node must prepare, and the GPUs it covers cluster-wide."""

    namespace: str
    job: str
    group: str
    pods: Mapping[str, tuple[str, ...]]
    """node → its member pods whose turn it is"""
    resources: tuple[str, ...]
    """`node/GPU` of every GPU the turn covers, sorted (the arbiter's GPUs)."""
    addresses: Mapping[str, str]
    """node → its agent's coordination address"""
    duty: int = 100
    tier: int = 0

    @property
    def key(self) -> str:
        """The arbiter's tenant: one per job and group."""
        return turn_key(self.namespace, self.job, self.group)

    @property
    def key_of(self) -> tuple[str, str]:
        """(namespace, job): whose pods the plan covers."""
        return self.namespace, self.job

    def keeping(self, placed: Mapping[str, str]) -> Plan:
        """The plan without the pods no longer where it put them (`placed`: pod → its node
        now), which left the cluster while the job waited: their agents would refuse to prepare
        them, failing the whole turn. Its GPUs stay as they were asked for; with none of its
        pods left, the plan as it was (its nodes' refusals say so)."""
        pods = {n: tuple(p for p in ps if placed.get(p) == n) for n, ps in self.pods.items()}
        pods = {n: ps for n, ps in pods.items() if ps}
        addresses = {n: a for n, a in self.addresses.items() if n in pods}
        return replace(self, pods=pods, addresses=addresses) if pods else self


def turn_key(namespace: str, job: str, group: str) -> str:
    """The arbiter's tenant for a job's turn on a group: `namespace/job[@group]`."""
    return f"{namespace}/{job}" + (f"@{group}" if group else "")


def member_of(pod: Mapping[str, Any]) -> tuple[str, str, Member] | None:
    """(namespace, job, member) for a live pod of a job (its `node` "" until it is scheduled),
    else None."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    labels = meta.get("labels") or {}
    job, node = job_of_labels(labels), spec.get("nodeName") or ""
    if not job or (pod.get("status") or {}).get("phase") in _DONE:
        return None
    namespace, name = meta.get("namespace", ""), meta.get("name", "")
    try:
        assignment = pod_assignment(meta.get("annotations") or {})
        gpus = {g for each in assignment.container_gpus.values() for g in each}
        gpus = gpus or set(assignment.assigned_gpus)
    except AnnotationError:
        gpus = set()
    try:
        request = parse_pod_request(pod)
        asks = request is not None
    except RequestError:
        request, asks = None, True
    uses_gpus = bool(gpus) or asks or bool(spec.get("resourceClaims"))
    duty = int(request.duty) if request is not None and request.duty else 100
    priority = spec.get("priority")
    tier = priority if isinstance(priority, int) and not isinstance(priority, bool) else 0
    group = str(labels.get(LABEL_LLMD_GROUP, ""))
    pod_key = f"{namespace}/{name}"
    member = Member(pod_key, node, tuple(sorted(gpus)), group, duty, tier, uses_gpus)
    return namespace, job, member


def node_of(obj: Mapping[str, Any]) -> Node:
    """A node object, read."""
    meta = obj.get("metadata") or {}
    annotations, labels = meta.get("annotations") or {}, meta.get("labels") or {}
    try:
        gpus = tuple(sorted(g.uuid for g in decode_gpus(annotations.get(ANNOTATION_GPUS))))
    except AnnotationError:
        gpus = ()
    groups = frozenset(
        k.removeprefix(NODE_GROUP_PREFIX)
        for k, v in labels.items()
        if k.startswith(NODE_GROUP_PREFIX) and v == "true"
    )
    address = str(annotations.get(ANNOTATION_AGENT_COORDINATION, ""))
    return Node(meta.get("name", ""), address, gpus, groups)


@dataclass
class ClusterView:
    """The jobs and nodes, as the watches last showed them."""

    members: dict[str, tuple[str, str, Member]] = field(default_factory=dict)
    """pod key (its watch's name and uid) → (namespace, job, member)"""
    nodes: dict[str, Node] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    on_pods_changed: Callable[[], None] = lambda: None
    """Called (from a watch's thread) after job pods changed or nodes went: members may leave."""
    on_agents_changed: Callable[[], None] = lambda: None
    """Called (from a watch's thread) after a node's agent address appeared or changed."""
    on_pod_seen: Callable[[Mapping[str, Any], bool], None] = lambda pod, gone: None
    """Called (from a watch's thread) with each job pod a watch event brings, and whether it
    went (deleted, or no longer labelled)."""
    on_pods_relisted: Callable[[], None] = lambda: None
    """Called (from a watch's thread) after job pods were listed again (some went unseen)."""
    listed: dict[str, threading.Event] = field(default_factory=dict, repr=False)
    """watch name → set once its first list is in (a new leader waits for all of them)."""

    def listed_once(self, source: str) -> threading.Event:
        """The event a watch sets once its first list is in."""
        with self.lock:
            return self.listed.setdefault(source, threading.Event())

    def wait_listed(self, timeout: float) -> bool:
        """Block until every watch has listed once (True), or `timeout` passes (False)."""
        with self.lock:
            events = list(self.listed.values())
        deadline = time.monotonic() + timeout
        return all(event.wait(max(0.0, deadline - time.monotonic())) for event in events)

    def plan(self, namespace: str, job: str, group: str = "") -> Plan:
        """The turn of `job` (on `group`, or on all its members); PlanError saying what is
        missing."""
        with self.lock:
            found = {m.pod: m for ns, j, m in self.members.values() if ns == namespace and j == job}
            nodes = dict(self.nodes)
        if not found:
            raise UnknownJob(f"no pod of namespace {namespace} carries job {job!r}")
        gpu_pods = [m for m in found.values() if m.uses_gpus]
        if not gpu_pods:
            raise PlanError(
                f"job {namespace}/{job}: none of its pods asks for a Baton GPU "
                f"({', '.join(sorted(found))}), so it has no turn to take"
            )
        mine = [m for m in gpu_pods if m.node]  # a pod with both job labels: once here
        if not mine:
            raise PlanError(
                f"job {namespace}/{job}: none of its pods is scheduled on a node yet "
                f"({', '.join(sorted(m.pod for m in gpu_pods))})"
            )
        if group:
            mine = [
                m
                for m in mine
                if m.group == group or group in nodes.get(m.node, Node(m.node)).groups
            ]
            if not mine:
                raise UnknownGroup(f"job {namespace}/{job} has no pod in group {group!r}")
        pods: dict[str, list[str]] = {}
        resources: set[str] = set()
        assigned: dict[str, str] = {}  # `node/GPU` → the member Baton assigned it
        for m in sorted(mine, key=lambda m: m.pod):
            node = nodes.get(m.node)
            if node is None or not node.address:
                raise PlanError(
                    f"node {m.node} (pod {m.pod}) has no Baton agent serving job turns "
                    "(no baton.dev/agent-coordination annotation)"
                )
            if not (m.gpus or node.gpus):
                raise PlanError(f"pod {m.pod} on node {m.node}: its GPUs are not known yet")
            # A node grants one lease per GPU: a second member on it would never get it. A pod
            # whose GPUs its node's claims name (DRA: every GPU of its node stands for them) is
            # left to its agent to check.
            for gpu in m.gpus:
                if (other := assigned.setdefault(f"{m.node}/{gpu}", m.pod)) != m.pod:
                    raise PlanError(
                        f"pods {other} and {m.pod} of job {namespace}/{job} share GPU {gpu} on "
                        f"node {m.node}: a job's turn needs each of its pods on GPUs of its own"
                    )
            pods.setdefault(m.node, []).append(m.pod)
            resources.update(f"{m.node}/{gpu}" for gpu in m.gpus or node.gpus)
        return Plan(
            namespace=namespace,
            job=job,
            group=group,
            pods={n: tuple(p) for n, p in sorted(pods.items())},
            resources=tuple(sorted(resources)),
            addresses={n: nodes[n].address for n in pods},
            duty=max(m.duty for m in mine),
            tier=max(m.tier for m in mine),
        )

    def namespaces_of(self, job: str) -> list[str]:
        """The namespaces that have a job of this name (llm-d's calls name no namespace)."""
        with self.lock:
            return sorted({ns for ns, j, _ in self.members.values() if j == job})

    def groups(self, seen: Callable[[str], bool] = lambda namespace: True) -> list[str]:
        """Every llm-d group: named by a node's label or by the label of a member pod of a
        namespace `seen` accepts."""
        with self.lock:
            named = {
                m.group for ns, _, m in self.members.values() if m.group and m.node and seen(ns)
            }
            named |= {g for n in self.nodes.values() for g in n.groups}
        return sorted(named)

    def group_resources(self, group: str) -> tuple[str, ...]:
        """`node/GPU` of every GPU in `group`: its labelled nodes' and its member pods'."""
        with self.lock:
            nodes = dict(self.nodes)
            members = [
                m
                for _, _, m in self.members.values()
                if m.group == group and m.node and m.uses_gpus
            ]
        found = {f"{n.name}/{g}" for n in nodes.values() if group in n.groups for g in n.gpus}
        for m in members:
            gpus = m.gpus or nodes.get(m.node, Node(m.node)).gpus
            found.update(f"{m.node}/{g}" for g in gpus)
        return tuple(sorted(found))

    def pods(self) -> set[str]:
        """Every job pod bound to a node (namespace/name)."""
        with self.lock:
            return {m.pod for _, _, m in self.members.values() if m.node}

    def handed(self, plan: Plan) -> Plan:
        """`plan`, asked for when its job asked, as the job's pods are when its turn is handed
        over: without the pods no longer where it put them, and, where some are gone, with the
        job's pods that took their place on the GPUs the job waited for (Baton assigned them
        those GPUs: a pod on a DRA node, whose GPUs the coordinator does not know, or one added
        on other GPUs, joins the next turn)."""
        kept = plan.keeping(self.placed())
        stay = {p for ps in kept.pods.values() for p in ps}
        if stay == {p for ps in plan.pods.values() for p in ps}:
            return kept
        with self.lock:
            nodes = dict(self.nodes)
            mine = [m for ns, j, m in self.members.values() if (ns, j) == plan.key_of and m.gpus]
        held = {f"{m.node}/{g}" for m in mine if m.pod in stay for g in m.gpus}
        free = set(plan.resources) - held
        pods, addresses = {n: list(ps) for n, ps in kept.pods.items()}, dict(kept.addresses)
        for m in sorted(mine, key=lambda m: m.pod):
            gpus, node = {f"{m.node}/{g}" for g in m.gpus}, nodes.get(m.node, Node(m.node))
            grouped = not plan.group or m.group == plan.group or plan.group in node.groups
            if m.pod not in stay and grouped and node.address and gpus <= free:
                free -= gpus
                pods.setdefault(m.node, []).append(m.pod)
                addresses[m.node] = node.address
        placed = {n: tuple(sorted(ps)) for n, ps in sorted(pods.items()) if ps}
        return replace(kept, pods=placed, addresses=addresses) if placed else kept

    def placed(self) -> dict[str, str]:
        """Every job pod bound to a node (namespace/name) → that node."""
        with self.lock:
            return {m.pod: m.node for _, _, m in self.members.values() if m.node}

    def addresses(self) -> dict[str, str]:
        """node → its agent's coordination address, for every node that has one."""
        with self.lock:
            return {n.name: n.address for n in self.nodes.values() if n.address}


class PodStore:
    """A reflector's store of job pods (`baton.contract.reflector.Store`); `source` names its
    watch (one per job label), whose pods it alone replaces."""

    def __init__(self, view: ClusterView, source: str) -> None:
        self._view = view
        self._prefix = f"{source}:"
        self._listed = view.listed_once(f"pods {source}")

    def _key(self, pod: dict[str, Any]) -> str:
        return self._prefix + str((pod.get("metadata") or {}).get("uid", ""))

    def replace(self, objects: list[dict[str, Any]], resource_version: str) -> None:
        found = {}
        for pod in objects:
            read = member_of(pod)
            if read is not None:
                found[self._key(pod)] = read
        with self._view.lock:
            kept = {k: v for k, v in self._view.members.items() if not k.startswith(self._prefix)}
            self._view.members = {**kept, **found}
        self._listed.set()
        self._view.on_pods_relisted()
        self._view.on_pods_changed()

    def apply(self, event: WatchEvent) -> None:
        self._view.on_pod_seen(event.object, event.type == "DELETED")
        key = self._key(event.object)
        read = None if event.type == "DELETED" else member_of(event.object)
        with self._view.lock:
            if read is None:
                self._view.members.pop(key, None)
            else:
                self._view.members[key] = read
        if read is None:
            self._view.on_pods_changed()


class NodeStore:
    """The reflector's store of nodes (`baton.contract.reflector.Store`)."""

    def __init__(self, view: ClusterView) -> None:
        self._view = view
        self._listed = view.listed_once("nodes")

    def replace(self, objects: list[dict[str, Any]], resource_version: str) -> None:
        nodes = {n.name: n for n in map(node_of, objects)}
        with self._view.lock:
            before, self._view.nodes = self._view.nodes, nodes
        self._listed.set()
        if any(_new_address(before.get(n.name), n) for n in nodes.values()):
            self._view.on_agents_changed()
        if before.keys() - nodes.keys():
            self._view.on_pods_changed()  # what the nodes gone left behind is forgotten

    def apply(self, event: WatchEvent) -> None:
        node = node_of(event.object)
        if event.type == "DELETED":
            with self._view.lock:
                self._view.nodes.pop(node.name, None)
            self._view.on_pods_changed()  # what the node left behind is forgotten
            return
        with self._view.lock:
            before = self._view.nodes.get(node.name)
            self._view.nodes[node.name] = node
        if _new_address(before, node):
            self._view.on_agents_changed()


def _new_address(before: Node | None, now: Node) -> bool:
    """Whether `now` names an agent address that `before` (the node as last seen) did not."""
    return bool(now.address) and (before is None or before.address != now.address)

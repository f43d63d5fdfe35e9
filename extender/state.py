"""The cluster as the extender sees it: nodes, assignments and our own assumed binds. Pure.

Fed by the cache's watches; each change rebuilds only the `NodeState` of the nodes it touches,
so placement reads precomputed per-GPU totals. An assumed assignment (recorded at bind, before
the watch shows it) counts like a real one until the watch shows the pod bound or gone; only
one whose bind went unanswered also expires.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from baton.contract.draclaim import ClaimAsk, ClaimRef, device_index
from baton.contract.podask import RequestMemo, TenantRequest
from extender.claims import ClaimBook
from extender.inventory import (
    Assignment,
    NodeInventory,
    assignment,
    node_inventory,
    pod_name,
    pod_uid,
)
from extender.relist import Journal, journaled, replay
from extender.snapshot import Limits, NodeState, PlacedPod, describe_node, node_state

Clock = Callable[[], float]
UNKNOWN_NODE = "node is not in the extender's cache (its watch has not shown it yet)"
UNSURE_TTL_S = 120.0
"""How long a bind sent with no answer, or an assumed pod a relist did not show, keeps its slot
when the watch does not show the pod."""


class ClusterState:
    """Nodes, assignments and assumptions, with a `NodeState` per node kept current."""

    def __init__(
        self, limits: Limits, clock: Clock, unsure_ttl_s: float = UNSURE_TTL_S, dra: bool = False
    ):
        self.limits = limits
        self.dra = dra
        """Pods are placed through DRA: filter and prioritize judge them by their claims."""
        self._clock = clock
        self._ttl = unsure_ttl_s
        self._nodes: dict[str, NodeInventory] = {}
        self._assigned: dict[str, Assignment] = {}
        self._assumed: dict[str, tuple[Assignment, float]] = {}
        self._unsure: dict[str, tuple[Assignment, float]] = {}
        """Assumptions whose bind went out with no answer (the pod may be bound there): counted
        until the watch shows the pod bound or gone, or they expire; a new bind of the same pod
        leaves them."""
        self._unlisted: dict[str, float] = {}
        """Assumed pods the last relist did not show (deleted before it, or created after it
        began), with when: dropped unless the watch shows the pod within the TTL."""
        self._by_node: dict[str, set[str]] = defaultdict(set)
        self._states: dict[str, NodeState] = {}
        self._pending: dict[str, dict[str, Any]] = {}
        """Pods not yet bound, as last seen: a bind reads them here instead of from the API."""
        self._requests = RequestMemo()
        self._claims = ClaimBook()
        """Pods placed through DRA, from their claims (the `--dra` extender's claim watch)."""
        self.journal: Journal | None = None
        """The changes made since `fork`, while a fork is out (`extender.relist`)."""

    def fork(self) -> ClusterState:
        """A copy of the state to rebuild a relist on, off the cache's lock (take it under the
        lock); from now until `adopt` this state journals its changes."""
        if self.journal is not None:
            raise RuntimeError("a fork of the cluster state is out already; adopt it first")
        fork = copy.copy(self)
        for table in ("_nodes", "_states", "_assigned", "_pending", "_assumed", "_unsure"):
            setattr(fork, table, dict(getattr(self, table)))
        fork._by_node = defaultdict(set, {name: set(uids) for name, uids in self._by_node.items()})
        fork._unlisted, fork._claims = dict(self._unlisted), self._claims.copy()
        self.journal = []
        return fork

    def adopt(self, fork: ClusterState | None) -> dict[str, Any]:
        """Replay on the fork the changes made here since it was taken, then take its tables, in
        one step (under the cache's lock); `None` drops the fork (its rebuild failed). Returns
        the tables replaced, to free off the lock (that takes a while too)."""
        journal, self.journal = self.journal or [], None
        replaced = dict(vars(self))
        if fork is not None:
            replay(journal, fork)
            vars(self).update(vars(fork))
        return replaced

    def request(self, pod: dict[str, Any]) -> TenantRequest | None:
        """The pod's Baton request (`parse_pod_request`, remembered while its resources stay
        the same); a `RequestError` when it is unusable."""
        return self._requests.request(pod)

    def node(self, name: str) -> NodeState | None:
        """The node's current state, or `None` when the cache does not know it."""
        return self._states.get(name)

    def nodes_by_name(self) -> Mapping[str, NodeState]:
        """Every node's current state (read-only; replaced, never edited, on change)."""
        return self._states

    def node_from_object(self, node: dict[str, Any]) -> NodeState:
        """A node the watch has not shown yet, from the object kube-scheduler sent."""
        return self._build(_name(node), node_inventory(node))

    def node_or_sent(
        self, name: str, sent: Mapping[str, dict[str, Any]] | None
    ) -> NodeState | None:
        """The node's current state; for one the watch has not shown yet, built from the object
        kube-scheduler sent (`sent`: its node objects by name, when it sends them); else None
        (`UNKNOWN_NODE` says why)."""
        node = self._states.get(name)
        if node is None and sent is not None:
            node = self.node_from_object(sent[name])
        return node

    def node_without(self, name: str, uids: set[str]) -> NodeState | None:
        """The node as it would be once the given pods are gone (preemption)."""
        inventory = self._nodes.get(name)
        if inventory is None:
            return None
        return self._build(name, inventory, exclude=uids)

    def node_names(self) -> list[str]:
        """Every known node."""
        return list(self._states)

    def assumption(self, uid: str) -> Assignment | None:
        """The pod's assignment from a bind of ours in flight or not yet confirmed, if any."""
        entry = self._assumed.get(uid)
        return entry[0] if entry else None

    def assumed(self) -> dict[str, Assignment]:
        """Assignments from our binds the watch has not confirmed yet."""
        return {uid: a for uid, (a, _) in self._assumed.items()}

    @journaled
    def replace_nodes(self, nodes: Iterable[dict[str, Any]]) -> None:
        """Start over from a full node list."""
        self._nodes = {_name(n): node_inventory(n) for n in nodes}
        self._rebuild_all()

    @journaled
    def upsert_node(self, node: dict[str, Any]) -> None:
        """A node was added or changed."""
        self._nodes[_name(node)] = node_inventory(node)
        self._rebuild_many({_name(node)})

    @journaled
    def delete_node(self, node: dict[str, Any]) -> None:
        """A node went away."""
        self._nodes.pop(_name(node), None)
        self._rebuild_many({_name(node)})

    @journaled
    def replace_pods(self, pods: Iterable[dict[str, Any]]) -> None:
        """Start over from a full pod list.

        Assumptions about pods it shows bound are settled and dropped; those about pods it shows
        pending stay (the list may predate the bind; the watch from it shows the bind). A pod it
        does not show was deleted before the list, or created after the list began: its
        assumption stays, marked, and expires unless the watch shows the pod within the TTL.
        """
        self._assigned.clear()
        self._by_node.clear()
        self._pending.clear()
        pods = list(pods)
        if self.dra:
            self._claims.replace_pods({pod_uid(p): pod_name(p) for p in pods})
        listed: set[str] = set()
        for pod in pods:
            self._note_pending(pod)
            listed.add(pod_uid(pod))
            found = assignment(pod, self.request)
            if found:
                self._add(found)
        settled = listed - set(self._pending)
        for uid in settled:
            self._drop_assumed(uid)
            self._drop_unsure(uid)
        for uid in self._assumed:
            if uid in listed:
                self._unlisted.pop(uid, None)
            else:
                self._unlisted[uid] = self._clock()
        self._expire()
        self._rebuild_all()

    @journaled
    def upsert_pod(self, pod: dict[str, Any]) -> None:
        """A pod was added or changed.

        A pod shown bound settles every assumption about it. When it holds what was counted for
        it already (the watch confirming our bind as assumed, or a status change of a running
        tenant), no node changes and none is rebuilt.
        """
        uid = pod_uid(pod)
        self._note_pending(pod)
        self._unlisted.pop(uid, None)
        before = self._counted(uid)
        touched = self._remove(uid)
        found = assignment(pod, self.request)
        if found:
            self._add(found)
            touched.add(found.node)
        if uid not in self._pending:
            touched |= self._drop_assumed(uid)
            if found is not None and found == before:
                touched = set()
            touched |= self._drop_unsure(uid)
        touched |= self._expire()
        if self.dra:
            touched |= self._claims.pod_seen(uid, pod)
        self._rebuild_many(touched)

    @journaled
    def delete_pod(self, pod: dict[str, Any]) -> None:
        """A pod went away; so does any assumption about it."""
        uid = pod_uid(pod)
        self._pending.pop(uid, None)
        self._requests.forget(uid)
        gone = self._claims.pod_gone(uid) if self.dra else set()
        dropped = self._drop_assumed(uid) | self._drop_unsure(uid)
        self._rebuild_many(self._remove(uid) | dropped | self._expire() | gone)

    def claim_asks(self, ref: ClaimRef) -> tuple[ClaimAsk, ...] | str | None:
        """A claim's asks of Baton's class, why they are unreadable, or None when unknown."""
        return self._claims.asks(ref)

    @journaled
    def replace_claims(self, claims: Iterable[dict[str, Any]]) -> None:
        """Start over from a full ResourceClaim list."""
        self._claims.replace_claims(claims)
        self._rebuild_all()

    @journaled
    def upsert_claim(self, claim: dict[str, Any]) -> None:
        """A ResourceClaim was added or changed (allocated, reserved, released)."""
        self._rebuild_many(self._claims.upsert_claim(claim))

    @journaled
    def delete_claim(self, claim: dict[str, Any]) -> None:
        """A ResourceClaim went away."""
        self._rebuild_many(self._claims.delete_claim(claim))

    def pending_pod(self, uid: str) -> dict[str, Any] | None:
        """The unbound pod with this UID as the watch last showed it, if any."""
        return self._pending.get(uid)

    def _note_pending(self, pod: dict[str, Any]) -> None:
        uid = pod_uid(pod)
        if (pod.get("spec") or {}).get("nodeName"):
            self._pending.pop(uid, None)
        else:
            self._pending[uid] = pod

    @journaled
    def assume(self, found: Assignment) -> None:
        """Count an assignment from our own bind until the watch shows it."""
        touched = self._drop_assumed(found.uid) | self._expire()
        self._assumed[found.uid] = (found, self._clock())  # the bind has just read the pod
        self._rebuild_many(touched | {found.node})

    @journaled
    def forget(self, uid: str) -> None:
        """Drop an assumption (its bind failed)."""
        self._rebuild_many(self._drop_assumed(uid))

    @journaled
    def keep_unsure(self, uid: str) -> None:
        """The pod's bind went out and no answer came: its assumption stays, past a new bind of
        the pod too, until the watch shows the pod bound or gone, or it expires."""
        self._unlisted.pop(uid, None)
        entry = self._assumed.pop(uid, None)
        if entry is not None:
            self._unsure[uid] = entry  # counted the same: no node changes

    def _counted(self, uid: str) -> Assignment | None:
        """What the pod counts as on its node now: our assumption over the watch's view."""
        entry = self._assumed.get(uid)
        return entry[0] if entry else self._assigned.get(uid)

    def _add(self, found: Assignment) -> None:
        self._assigned[found.uid] = found
        self._by_node[found.node].add(found.uid)

    def _remove(self, uid: str) -> set[str]:
        old = self._assigned.pop(uid, None)
        if old is None:
            return set()
        on_node = self._by_node[old.node]
        on_node.discard(uid)
        if not on_node:  # nodes come and go all day, each name seen once
            del self._by_node[old.node]
        return {old.node}

    def _drop_assumed(self, uid: str) -> set[str]:
        self._unlisted.pop(uid, None)
        return _drop(self._assumed, uid)

    def _drop_unsure(self, uid: str) -> set[str]:
        return _drop(self._unsure, uid)

    def _expire(self) -> set[str]:
        """Drop unsure assumptions, and those a relist did not show, past their time.

        An answered (or in-flight) bind's assumption of a pod the watch has shown never
        expires: the watch is bound to show the pod bound or gone, however late; expiring it on
        a lagging watch would free a slot that is taken (kube-scheduler stopped expiring
        assumed pods for the same reason, kubernetes#106361)."""
        deadline = self._clock() - self._ttl
        touched: set[str] = set()
        for uid in [uid for uid, (_, at) in self._unsure.items() if at < deadline]:
            touched |= self._drop_unsure(uid)
        for uid in [uid for uid, at in self._unlisted.items() if at < deadline]:
            touched |= self._drop_assumed(uid)
        return touched

    def _rebuild_all(self) -> None:
        self._states = {name: self._build(name, inv) for name, inv in self._nodes.items()}

    def _rebuild_many(self, names: set[str]) -> None:
        for name in names:
            inventory = self._nodes.get(name)
            if inventory is None:
                self._states.pop(name, None)
            else:
                self._states[name] = self._build(name, inventory)

    def _build(
        self, name: str, inventory: NodeInventory, exclude: set[str] | None = None
    ) -> NodeState:
        tenants: dict[str, list[PlacedPod]] = defaultdict(list)
        for found in self.assignments_on(name):
            if exclude and found.uid in exclude:
                continue
            for gpu in found.gpus:
                tenants[gpu].append(found.tenant)
        self._add_claimed(name, inventory, tenants, exclude)
        before = self._states.get(name)
        return node_state(
            name,
            inventory.gpus,
            inventory.budget_mib,
            tenants,
            self.limits,
            inventory.problem,
            reuse=before.gpus if before is not None else (),
        )

    def _add_claimed(
        self,
        name: str,
        inventory: NodeInventory,
        tenants: dict[str, list[PlacedPod]],
        exclude: set[str] | None,
    ) -> None:
        """The node's tenants through DRA claims, on the GPU each allocated device names."""
        held = self._claims.on_node(name)
        if not held:
            return
        uuids = {g.index: g.uuid for g in inventory.gpus}
        for found in held:
            if found.uid in self._assigned or (exclude and found.uid in exclude):
                continue
            for device in found.gpus:
                index = device_index(device)
                if index is not None and index in uuids:
                    tenants[uuids[index]].append(found.tenant)

    def assignments_on(self, name: str) -> list[Assignment]:
        """Confirmed and assumed assignments on a node."""
        found = [
            self._assigned[uid] for uid in self._by_node.get(name, ()) if uid not in self._assumed
        ]
        unsure = [a for a, _ in self._unsure.values() if a.node == name]
        return found + [a for a, _ in self._assumed.values() if a.node == name] + unsure

    def inventory(self) -> list[dict[str, Any]]:
        """Every node, GPU and tenant, for `/v1/inventory`."""
        return [self._describe(name) for name in sorted(self._states)]

    def _describe(self, name: str) -> dict[str, Any]:
        assumed = {uid for uid, (a, _) in self._assumed.items() if a.node == name}
        pods = {a.uid: a.pod for a in [*self._claims.on_node(name), *self.assignments_on(name)]}
        return describe_node(self._states[name], assumed, pods)


def _name(node: dict[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("name", ""))


def _drop(table: dict[str, tuple[Assignment, float]], uid: str) -> set[str]:
    """Remove the pod's entry from an assumption table; the node it was on, if any."""
    entry = table.pop(uid, None)
    return {entry[0].node} if entry else set()

"""Pods placed through DRA, as the extender counts them: from their claims' allocations. Pure.

On the DRA path no one annotates a pod with its GPUs: the scheduler allocates a device of the
driver's slice to each claim and reserves the claim for the pod. A live pod holds, on the node
its claims' results name, the devices (`gpu-<index>`) with the largest memory and duty any of
its results consumed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from baton.contract import names
from baton.contract.draclaim import (
    ClaimAsk,
    ClaimRef,
    ClaimShare,
    claim_asks,
    claim_ref,
    claim_shares,
    reserved_pods,
)
from extender.inventory import Assignment, pod_name
from extender.snapshot import PlacedPod

_NOTHING: frozenset[str] = frozenset()


class ClaimBook:
    """Claims by name, live pods, and what each pod holds through its claims, by node."""

    def __init__(self) -> None:
        self._asks: dict[ClaimRef, tuple[ClaimAsk, ...] | str] = {}
        """A claim's asks of Baton's class, or why they cannot be read."""
        self._held: dict[ClaimRef, tuple[tuple[str, ...], tuple[ClaimShare, ...]]] = {}
        """An allocated claim's pods (UIDs) and results of Baton's driver."""
        self._claims_of: dict[str, set[ClaimRef]] = defaultdict(set)
        self._live: dict[str, str] = {}
        """Live pods: UID -> namespace/name."""
        self._placed: dict[str, Assignment] = {}
        self._by_node: dict[str, dict[str, Assignment]] = defaultdict(dict)

    def copy(self) -> ClaimBook:
        """An independent copy (for a relist rebuilt off the lock: `extender.relist`)."""
        book = ClaimBook()
        book._asks, book._held = dict(self._asks), dict(self._held)
        book._claims_of.update((uid, set(refs)) for uid, refs in self._claims_of.items())
        book._live, book._placed = dict(self._live), dict(self._placed)
        book._by_node.update((node, dict(held)) for node, held in self._by_node.items())
        return book

    def asks(self, ref: ClaimRef) -> tuple[ClaimAsk, ...] | str | None:
        """The claim's asks, why they are unreadable, or None when the claim is not known."""
        return self._asks.get(ref)

    def on_node(self, node: str) -> Iterable[Assignment]:
        """The pods holding devices of `node` through claims (`gpus` are device names)."""
        return self._by_node.get(node, {}).values()

    def replace_claims(self, claims: Iterable[Mapping[str, Any]]) -> set[str]:
        """Start over from a full claim list; the nodes whose holders changed."""
        self._asks.clear()
        self._held.clear()
        self._claims_of.clear()
        for claim in claims:
            self._note(claim)
        return self._refresh(set(self._placed) | set(self._claims_of))

    def upsert_claim(self, claim: Mapping[str, Any]) -> set[str]:
        """A claim was added or changed."""
        before = self._forget(claim_ref(claim))
        return self._refresh(before | self._note(claim))

    def delete_claim(self, claim: Mapping[str, Any]) -> set[str]:
        """A claim went away."""
        return self._refresh(self._forget(claim_ref(claim)))

    def replace_pods(self, live: Mapping[str, str]) -> set[str]:
        """The live pods, from a full pod list."""
        self._live = dict(live)
        return self._refresh(set(self._placed) | set(self._claims_of))

    def pod_seen(self, uid: str, pod: dict[str, Any]) -> frozenset[str] | set[str]:
        """A live pod was added or changed (nothing to do for one already known)."""
        if uid in self._live:
            return _NOTHING
        self._live[uid] = pod_name(pod)
        return self._refresh({uid}) if uid in self._claims_of else _NOTHING

    def pod_gone(self, uid: str) -> frozenset[str] | set[str]:
        """A pod was deleted or finished."""
        if self._live.pop(uid, None) is None:
            return _NOTHING
        return self._refresh({uid}) if uid in self._placed else _NOTHING

    def _note(self, claim: Mapping[str, Any]) -> set[str]:
        ref = claim_ref(claim)
        try:
            self._asks[ref] = claim_asks(claim)
        except ValueError as err:
            self._asks[ref] = f"claim {ref.namespace}/{ref.name}: {err}"
        shares = claim_shares(claim)
        pods = reserved_pods(claim) if shares else ()
        if pods:
            self._held[ref] = (pods, shares)
            for uid in pods:
                self._claims_of[uid].add(ref)
        return set(pods)

    def _forget(self, ref: ClaimRef) -> set[str]:
        self._asks.pop(ref, None)
        pods, _ = self._held.pop(ref, ((), ()))
        for uid in pods:
            refs = self._claims_of.get(uid)
            if refs is not None:
                refs.discard(ref)
                if not refs:
                    del self._claims_of[uid]
        return set(pods)

    def _refresh(self, uids: set[str]) -> set[str]:
        touched: set[str] = set()
        for uid in uids:
            old = self._placed.pop(uid, None)
            if old is not None:
                held = self._by_node[old.node]
                held.pop(uid, None)
                if not held:  # nodes come and go all day, each name seen once
                    del self._by_node[old.node]
            new = self._holding(uid)
            if new is not None:
                self._placed[uid] = new
                self._by_node[new.node][uid] = new
            if old != new:
                touched |= {a.node for a in (old, new) if a is not None}
        return touched

    def _holding(self, uid: str) -> Assignment | None:
        name = self._live.get(uid)
        if name is None:
            return None
        shares = [s for ref in self._claims_of.get(uid, ()) for s in self._held[ref][1]]
        if not shares:
            return None
        node = min(s.pool for s in shares)
        shares = [s for s in shares if s.pool == node]
        memory = [s.memory_bytes for s in shares]
        duty = [s.duty for s in shares]
        devices = tuple(sorted({s.device for s in shares}))
        on_each = [(d, tuple(s.duty for s in shares if s.device == d)) for d in devices]
        tenant = PlacedPod(
            uid,
            None if None in memory else max(m for m in memory if m is not None) // names.MIB,
            None if None in duty else max(d for d in duty if d is not None),
            tuple((d, duties) for d, duties in on_each if len(duties) > 1),
        )
        return Assignment(uid, name, node, devices, tenant)

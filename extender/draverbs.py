"""Filter and prioritize on the DRA path (`--dra`): pods whose GPUs come from claims.

kube-scheduler calls the extender after its own filters (DynamicResources included), so every
node it sends has a device that fits the pod's claims; the extender keeps what DRA cannot do:
the node's host-DRAM worst case, the policy's score, and reasons a user can read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from baton.contract import names
from baton.contract.draclaim import ClaimAsk, ClaimRef
from baton.contract.podask import RequestError, TenantRequest
from extender.draplace import Share, Shares, claim_judge
from extender.inventory import pod_uid
from extender.placement import Verdict
from extender.snapshot import NodeState
from extender.state import UNKNOWN_NODE, ClusterState
from extender.wire import MIN_PRIORITY, ExtenderArgs


def claim_request(state: ClusterState, pod: dict[str, Any]) -> tuple[TenantRequest, Shares] | None:
    """What the pod asks of Baton: its claims' requests of the class (and each request, in the
    order the scheduler allocates them), else its plain `baton.dev/gpu` limit (whose generated
    claim takes the class defaults); None: nothing.

    Raises RequestError with the reason when a claim is not known or not readable yet.
    """
    refs = _claims(pod)
    asks: list[ClaimAsk] = []
    for ref in refs:
        found = state.claim_asks(ref)
        if found is None:
            raise RequestError(
                f"claim {ref.namespace}/{ref.name} is not in the extender's cache yet"
            )
        if isinstance(found, str):
            raise RequestError(found)
        asks += found
    if not asks:
        plain = state.request(pod)
        return None if plain is None else (plain, ())
    memory = [a.memory_bytes for a in asks]
    duty = [a.duty for a in asks]
    request = TenantRequest(
        gpus=sum(a.count for a in asks),
        memory_mib=None if None in memory else max(m or 0 for m in memory) // names.MIB,
        duty=None if None in duty else max(d or 0.0 for d in duty),
    )
    shares = tuple(
        Share(a.count, None if a.memory_bytes is None else a.memory_bytes // names.MIB, a.duty)
        for a in asks
    )
    return request, shares


def uncached_claims(state: ClusterState, pod: dict[str, Any]) -> list[ClaimRef]:
    """The claims the pod names that the cache has not seen yet; none when a claim is not made
    yet (the pod kube-scheduler sent says so, whatever the cache learns)."""
    try:
        refs = _claims(pod)
    except RequestError:
        return []
    return [ref for ref in refs if state.claim_asks(ref) is None]


def _claims(pod: dict[str, Any]) -> list[ClaimRef]:
    """The claims the pod names; RequestError for one whose template's claim is not made, or a
    field of the wrong shape (named)."""
    meta, spec, status = (_field(pod, key, dict) for key in ("metadata", "spec", "status"))
    made = {
        str(s.get("name")): s.get("resourceClaimName")
        for s in _objects(status, "status.resourceClaimStatuses")
    }
    refs = []
    for entry in _objects(spec, "spec.resourceClaims"):
        name = entry.get("resourceClaimName") or made.get(str(entry.get("name")))
        if not name:
            raise RequestError(f"the claim for {entry.get('name')!r} is not made yet")
        refs.append(ClaimRef(str(meta.get("namespace", "")), str(name)))
    return refs


def _field(obj: dict[str, Any], path: str, kind: type) -> Any:
    """The value at `path`'s last part in `obj` (empty when absent); RequestError naming the
    path when it is not a `kind`."""
    value = obj.get(path.rpartition(".")[2]) or kind()
    if not isinstance(value, kind):
        raise RequestError(f"pod field {path} must be {'an object' if kind is dict else 'a list'}")
    return value


def _objects(obj: dict[str, Any], path: str) -> list[dict[str, Any]]:
    """The list of objects at `path` (its last part a key of `obj`); RequestError naming it."""
    items = _field(obj, path, list)
    if not all(isinstance(item, dict) for item in items):
        raise RequestError(f"pod field {path} must be a list of objects")
    return list(items)


def filter_claims(
    state: ClusterState, args: ExtenderArgs
) -> tuple[list[str], dict[str, str], dict[str, int]]:
    """Names that pass, failed node -> reason, and the passing nodes' scores (for prioritize)."""
    try:
        asked = claim_request(state, args.pod)
    except RequestError as err:
        return [], dict.fromkeys(args.node_names, str(err)), {}
    if asked is None:
        return list(args.node_names), {}, {}
    request, shares = asked
    judge = claim_judge(request, state.limits, shares)
    passed: list[str] = []
    failed: dict[str, str] = {}
    scores: dict[str, int] = {}
    nodes = state.nodes_by_name()
    for name in args.node_names:
        verdict = _verdict(state, args, judge, name, nodes.get(name))
        if verdict.fits:
            passed.append(name)
            scores[name] = verdict.score
        else:
            failed[name] = verdict.reason
    return passed, failed, scores


def prioritize_claims(
    state: ClusterState, args: ExtenderArgs, known: dict[str, int]
) -> list[tuple[str, int]]:
    """The policy's 0-10 score on the GPUs the scheduler would allocate; 0 where it fails.
    `known`: the scores filter found for this pod, used where it has them."""
    try:
        asked = claim_request(state, args.pod)
    except RequestError:
        asked = None
    if asked is None:
        return [(name, MIN_PRIORITY) for name in args.node_names]
    request, shares = asked
    judge = claim_judge(request, state.limits, shares)
    scores = []
    for name in args.node_names:
        score = known.get(name)
        if score is None:
            verdict = _verdict(state, args, judge, name)
            score = verdict.score if verdict.fits else MIN_PRIORITY
        scores.append((name, score))
    return scores


def _verdict(
    state: ClusterState,
    args: ExtenderArgs,
    judge: Callable[[NodeState], Verdict],
    name: str,
    node: NodeState | None = None,
) -> Verdict:
    """The judge's verdict on node `name` (`node`, where the caller has it from the state)."""
    if node is None:
        node = state.node_or_sent(name, args.nodes)
    if node is None:
        return Verdict(False, UNKNOWN_NODE)
    uid = pod_uid(args.pod)
    if _holds(node, uid):  # its claims are still reserved for it: judged without them
        node = state.node_without(name, {uid}) or node
    return judge(node)


def _holds(node: NodeState, uid: str) -> bool:
    """Whether the node counts the pod already: kube-scheduler filters a pod again while its
    claims are allocated and reserved for it (after a failed bind, before Unreserve's patch is
    seen), and allocates nothing more for them."""
    return any(uid in load.tenants for load in node.gpus)

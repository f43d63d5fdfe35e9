"""The filter and prioritize verbs over the cluster state (no HTTP here)."""

from __future__ import annotations

from typing import Any

from extender.placement import NodeState, Verdict, one_gpu_chooser, one_gpu_filter, place
from extender.requests import RequestError, TenantRequest, parse_pod_request
from extender.state import ClusterState
from extender.wire import MIN_PRIORITY, ExtenderArgs, PreemptionArgs

UNKNOWN_NODE = "node is not in the extender's cache (its watch has not shown it yet)"


def filter_nodes(
    state: ClusterState, args: ExtenderArgs
) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """Names that pass, failed node -> reason, unresolvable node -> reason."""
    passed: list[str] = []
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    try:
        request = parse_pod_request(args.pod)
    except RequestError as err:
        return [], {}, dict.fromkeys(args.node_names, str(err))
    if request is None:
        return list(args.node_names), failed, unresolvable
    fits = one_gpu_filter(request, state.limits) if request.gpus == 1 else None
    nodes = state.nodes_by_name()
    for name in args.node_names:
        node = nodes.get(name)
        if fits is not None and node is not None and fits(node):
            passed.append(name)
            continue
        verdict = _verdict(state, args, request, name, choose=False)
        if verdict.fits:
            passed.append(name)
        elif verdict.unresolvable:
            unresolvable[name] = verdict.reason
        else:
            failed[name] = verdict.reason
    return passed, failed, unresolvable


def _usable_request(pod: dict[str, Any]) -> TenantRequest | None:
    """The pod's Baton request; None when it makes none or an unusable one (filter says why)."""
    try:
        return parse_pod_request(pod)
    except RequestError:
        return None


def prioritize_nodes(state: ClusterState, args: ExtenderArgs) -> list[tuple[str, int]]:
    """A 0-10 score per node; nodes it does not fit and pods without a Baton request get 0."""
    request = _usable_request(args.pod)
    if request is None:
        return [(name, MIN_PRIORITY) for name in args.node_names]
    choose = one_gpu_chooser(request, state.limits) if request.gpus == 1 else None
    nodes = state.nodes_by_name()
    scores = []
    for name in args.node_names:
        node = nodes.get(name)
        if choose is not None and node is not None:
            best = choose(node)
            scores.append((name, MIN_PRIORITY if best is None else best[1]))
            continue
        verdict = _verdict(state, args, request, name, choose=True)
        scores.append((name, verdict.score if verdict.fits else MIN_PRIORITY))
    return scores


def _verdict(
    state: ClusterState, args: ExtenderArgs, request: TenantRequest, name: str, choose: bool
) -> Verdict:
    node: NodeState | None = state.node(name)
    if node is None and args.nodes is not None:
        node = state.node_from_object(args.nodes[name])
    if node is None:
        return Verdict(False, UNKNOWN_NODE)
    return place(node, request, state.limits, choose)


def preempt_nodes(state: ClusterState, args: PreemptionArgs) -> list[str]:
    """The candidate nodes where evicting the proposed victims makes room for the pod.

    A pod without a Baton request (or with an unusable one) leaves the candidates as they are.
    """
    request = _usable_request(args.pod)
    if request is None:
        return list(args.victims)
    kept = []
    for name, uids in args.victims.items():
        node = state.node_without(name, set(uids))
        if node is not None and place(node, request, state.limits, choose=False).fits:
            kept.append(name)
    return kept

"""The filter and prioritize verbs over the cluster state (no HTTP here)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from baton.contract.podask import RequestError, TenantRequest
from extender.draverbs import filter_claims, prioritize_claims
from extender.placement import Verdict, one_gpu_chooser, place
from extender.state import UNKNOWN_NODE, ClusterState
from extender.wire import MIN_PRIORITY, ExtenderArgs, PreemptionArgs


class FilterScores:
    """The scores filter found for the last few pods, for the prioritize call that follows.

    kube-scheduler filters and scores a pod in one scheduling cycle, on one snapshot of the
    cluster. Filter's fast path finds each node's best GPU anyway; keeping its score means
    prioritize scores the pod on the state filter judged it on (a bind finished in between
    does not make the two disagree) and costs a lookup instead of a second placement. A node
    filter did not score (or a pod it did not see) is scored afresh.
    """

    def __init__(self, pods: int = 16):
        self._pods = pods
        self._scores: OrderedDict[str, dict[str, int]] = OrderedDict()

    def keep(self, pod: str, scores: dict[str, int]) -> None:
        """Filter's scores for the pod (its UID and resourceVersion); the oldest pod's go when
        more than `pods` are kept."""
        self._scores[pod] = scores
        self._scores.move_to_end(pod)
        while len(self._scores) > self._pods:
            self._scores.popitem(last=False)

    def __len__(self) -> int:
        """Pods whose scores are kept."""
        return len(self._scores)

    def take(self, pod: str) -> dict[str, int]:
        """The pod's scores by node (empty if filter kept none); they are used once."""
        return self._scores.pop(pod, None) or {}


def filter_nodes(
    state: ClusterState, args: ExtenderArgs, kept: FilterScores | None = None
) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """Names that pass, failed node -> reason, unresolvable node -> reason.

    With `kept`, the scores of the passing nodes are kept for prioritize (claim pods, and
    one-GPU pods on the plain path)."""
    unresolvable: dict[str, str] = {}
    if state.dra:
        passed, failed, scores = filter_claims(state, args)
    else:
        passed, failed, unresolvable, scores = _filter_plain(state, args)
    version = _version(args.pod)
    if kept is not None and scores and version:
        kept.keep(version, scores)
    return passed, failed, unresolvable


def _filter_plain(
    state: ClusterState, args: ExtenderArgs
) -> tuple[list[str], dict[str, str], dict[str, str], dict[str, int]]:
    """`filter_nodes` for pods asking through the device plugin's resources; also the scores
    of the nodes the one-GPU fast path judged."""
    passed: list[str] = []
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    scores: dict[str, int] = {}
    try:
        request = state.request(args.pod)
    except RequestError as err:
        return [], {}, dict.fromkeys(args.node_names, str(err)), scores
    if request is None:
        return list(args.node_names), failed, unresolvable, scores
    choose = one_gpu_chooser(request, state.limits) if request.gpus == 1 else None
    nodes = state.nodes_by_name()
    for name in args.node_names:
        node = nodes.get(name)
        best = choose(node) if choose is not None and node is not None else None
        if best is not None:
            passed.append(name)
            scores[name] = best[1]
            continue
        verdict = _verdict(state, args, request, name, choose=False)
        if verdict.fits:
            passed.append(name)
        elif verdict.unresolvable:
            unresolvable[name] = verdict.reason
        else:
            failed[name] = verdict.reason
    return passed, failed, unresolvable, scores


def _version(pod: dict[str, Any]) -> str:
    """The pod's UID and resourceVersion ("" without a UID): what filter's scores are kept by,
    so a pod changed in between is scored afresh."""
    meta = pod.get("metadata") or {}
    uid, version = meta.get("uid"), meta.get("resourceVersion")
    return f"{uid}/{version}" if isinstance(uid, str) and uid else ""


def _usable_request(state: ClusterState, pod: dict[str, Any]) -> TenantRequest | None:
    """The pod's Baton request; None when it makes none or an unusable one (filter says why)."""
    try:
        return state.request(pod)
    except RequestError:
        return None


def prioritize_nodes(
    state: ClusterState, args: ExtenderArgs, kept: FilterScores | None = None
) -> list[tuple[str, int]]:
    """A 0-10 score per node; nodes it does not fit and pods without a Baton request get 0.

    With `kept`, the scores filter kept for this pod are used where it has them."""
    known = kept.take(_version(args.pod)) if kept is not None else {}
    if known and known.keys() >= set(args.node_names):
        return [(name, known[name]) for name in args.node_names]
    if state.dra:
        return prioritize_claims(state, args, known)
    request = _usable_request(state, args.pod)
    if request is None:
        return [(name, MIN_PRIORITY) for name in args.node_names]
    choose = one_gpu_chooser(request, state.limits) if request.gpus == 1 else None
    nodes = state.nodes_by_name()
    scores = []
    for name in args.node_names:
        score = known.get(name)
        if score is not None:
            scores.append((name, score))
            continue
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
    node = state.node_or_sent(name, args.nodes)
    if node is None:
        return Verdict(False, UNKNOWN_NODE)
    return place(node, request, state.limits, choose)


def preempt_nodes(state: ClusterState, args: PreemptionArgs) -> list[str]:
    """The candidate nodes where evicting the proposed victims makes room for the pod.

    A pod without a Baton request (or with an unusable one) leaves the candidates as they are.
    """
    request = _usable_request(state, args.pod)
    if request is None:
        return list(args.victims)
    kept = []
    for name, uids in args.victims.items():
        node = state.node_without(name, set(uids))
        if node is not None and place(node, request, state.limits, choose=False).fits:
            kept.append(name)
    return kept

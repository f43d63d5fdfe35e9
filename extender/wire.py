"""kube-scheduler's extender/v1 JSON, as it sends and reads it.

The Go structs have no json tags, so keys are PascalCase field names and nil is `null`; Go
decodes keys case-insensitively, so we accept any case. Nested Pods and Nodes are ordinary
camelCase Kubernetes objects.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import orjson

MIN_PRIORITY = 0
MAX_PRIORITY = 10
INT64 = range(-(2**63), 2**63)
"""What a Go int64 holds (NumPDBViolations): Go's decoder refuses any other number there."""


class WireError(ValueError):
    """The request body is not what kube-scheduler sends; the message names the field."""


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """A filter or prioritize request."""

    pod: dict[str, Any]
    node_names: list[str]
    nodes: dict[str, dict[str, Any]] | None
    """The full Node objects by name when sent as a NodeList (not node-cache-capable)."""


@dataclass(frozen=True, slots=True)
class BindingArgs:
    """A bind request."""

    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


def decode(body: bytes) -> dict[str, Any]:
    """A JSON object with its top-level keys lowercased."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise WireError(f"request body is not valid JSON: {err}") from None
    if not isinstance(value, dict):
        raise WireError(f"request body must be a JSON object, not {type(value).__name__}")
    return {str(k).lower(): v for k, v in value.items()}


def _pod(fields: dict[str, Any]) -> dict[str, Any]:
    pod = fields.get("pod")
    if not isinstance(pod, dict):
        raise WireError("field Pod is missing or not an object")
    if not isinstance(pod.get("metadata", {}), dict | None):
        raise WireError("field Pod.metadata must be an object")
    return pod


def extender_args(body: bytes) -> ExtenderArgs:
    """Parse ExtenderArgs: `Pod` plus either `NodeNames` or `Nodes`."""
    fields = decode(body)
    pod = _pod(fields)
    names = fields.get("nodenames")
    if names is not None:
        if not isinstance(names, list) or not all(map(isinstance, names, repeat(str))):
            raise WireError("field NodeNames must be a list of node names or null")
        return ExtenderArgs(pod, names, None)
    node_list = fields.get("nodes")
    if node_list is None:
        raise WireError("fields NodeNames and Nodes are both null; one must list the nodes")
    items = node_list.get("items") if isinstance(node_list, dict) else None
    if items is None and isinstance(node_list, dict):
        items = []
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise WireError("field Nodes must be a NodeList with an items list")
    nodes = {_node_name(i): i for i in items}
    return ExtenderArgs(pod, list(nodes), nodes)


def _node_name(node: dict[str, Any]) -> str:
    """The item's name, once its metadata is shaped as the rest of the extender reads it."""
    meta = node.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(meta, dict) or not isinstance(name, str) or not name:
        raise WireError("field Nodes has an item without metadata.name")
    notes = meta.get("annotations") or {}
    if not isinstance(notes, dict) or not all(map(isinstance, notes.values(), repeat(str))):
        raise WireError(f"field Nodes: node {name}: metadata.annotations must map keys to strings")
    return name


@dataclass(frozen=True, slots=True)
class PreemptionArgs:
    """A preempt request: per candidate node, the UIDs of the pods kube-scheduler would evict."""

    pod: dict[str, Any]
    victims: dict[str, list[str]]
    pdb_violations: dict[str, int]


def preemption_args(body: bytes) -> PreemptionArgs:
    """Parse ExtenderPreemptionArgs (meta victims by UID, or full victim pods)."""
    fields = decode(body)
    pod = _pod(fields)
    meta = fields.get("nodenametometavictims")
    full = fields.get("nodenametovictims")
    by_node = meta if meta is not None else full
    if not isinstance(by_node, dict):
        raise WireError("fields NodeNameToMetaVictims and NodeNameToVictims are both null")
    victims: dict[str, list[str]] = {}
    violations: dict[str, int] = {}
    for node, entry in by_node.items():
        if not isinstance(entry, dict):
            raise WireError(f"victims of node {node} must be an object")
        entry = {str(k).lower(): v for k, v in entry.items()}
        pods = entry.get("pods") or []
        if not isinstance(pods, list) or not all(isinstance(p, dict) for p in pods):
            raise WireError(f"victims of node {node}: Pods must be a list of objects")
        victims[node] = [_victim_uid(p, meta is not None) for p in pods]
        violations[node] = _pdb_violations(node, entry.get("numpdbviolations"))
    return PreemptionArgs(pod, victims, violations)


def _pdb_violations(node: str, value: object) -> int:
    """NumPDBViolations (null: 0), an int64 as Go decodes it; the answer echoes it back."""
    if value is None:
        return 0
    if type(value) is not int or value not in INT64:
        raise WireError(
            f"victims of node {node}: NumPDBViolations must be an int64 (a whole number from"
            f" -2^63 to 2^63-1), not {reprlib.repr(value)}"
        )
    return value


def _object(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _victim_uid(pod: dict[str, Any], meta: bool) -> str:
    uid = pod.get("UID", pod.get("uid")) if meta else _object(pod.get("metadata")).get("uid")
    if not isinstance(uid, str) or not uid:
        raise WireError("a victim has no UID")
    return uid


def preemption_result(args: PreemptionArgs, nodes: list[str]) -> dict[str, Any]:
    """ExtenderPreemptionResult: always the meta (UID) form."""
    return {
        "NodeNameToMetaVictims": {
            node: {
                "Pods": [{"UID": uid} for uid in args.victims[node]],
                "NumPDBViolations": args.pdb_violations[node],
            }
            for node in nodes
        }
    }


def binding_args(body: bytes) -> BindingArgs:
    """Parse ExtenderBindingArgs."""
    fields = decode(body)
    values = []
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        value = fields.get(key.lower())
        if not isinstance(value, str) or (not value and key != "PodUID"):
            raise WireError(f"field {key} is missing or not a non-empty string")
        values.append(value)
    return BindingArgs(*values)


def filter_result(
    args: ExtenderArgs,
    passed: list[str],
    failed: dict[str, str],
    unresolvable: dict[str, str],
    error: str = "",
) -> dict[str, Any]:
    """ExtenderFilterResult in the same form (names or NodeList) as the request."""
    if args.nodes is None:
        nodes, names = None, passed
    else:
        nodes, names = {"metadata": {}, "items": [args.nodes[n] for n in passed]}, None
    return {
        "Nodes": nodes,
        "NodeNames": names,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": error,
    }


def host_priorities(scores: list[tuple[str, int]]) -> list[dict[str, Any]]:
    """HostPriorityList."""
    return [{"Host": host, "Score": score} for host, score in scores]


def binding_result(error: str = "") -> dict[str, Any]:
    """ExtenderBindingResult."""
    return {"Error": error}


def encode(value: Any) -> bytes:
    """Compact JSON bytes. orjson writes at most 254 levels of nesting and reads 1024: an
    answer too deep to write echoes request objects (Nodes) as deep, so the request is refused."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as err:
        if str(err) != "Recursion limit reached":
            raise
        raise WireError(
            "field Nodes: an item nests objects or lists more than 254 levels deep; the answer"
            " echoes the items and cannot (no Kubernetes Node is that deep)"
        ) from None

"""kube-scheduler's extender/v1 JSON, as it sends and reads it.

The Go structs have no json tags, so keys are PascalCase field names and nil is `null`; Go
decodes keys case-insensitively, so we accept any case. Nested Pods and Nodes are ordinary
camelCase Kubernetes objects.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MIN_PRIORITY = 0
MAX_PRIORITY = 10


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
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise WireError(f"request body is not valid JSON: {err}") from None
    if not isinstance(value, dict):
        raise WireError(f"request body must be a JSON object, not {type(value).__name__}")
    return {str(k).lower(): v for k, v in value.items()}


def extender_args(body: bytes) -> ExtenderArgs:
    """Parse ExtenderArgs: `Pod` plus either `NodeNames` or `Nodes`."""
    fields = decode(body)
    pod = fields.get("pod")
    if not isinstance(pod, dict):
        raise WireError("field Pod is missing or not an object")
    names = fields.get("nodenames")
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
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
    name = (node.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not name:
        raise WireError("field Nodes has an item without metadata.name")
    return name


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
    """Compact JSON bytes."""
    return json.dumps(value, separators=(",", ":")).encode()

"""Patch application and selector matching for the fake API server (RFC 7386, RFC 6902)."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
PATCH_TYPES = (JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH)


class PatchError(ValueError):
    """A well-formed patch that cannot be applied to the object (HTTP 422)."""


class SelectorError(ValueError):
    """A selector the server does not understand (HTTP 400)."""


def apply_patch(content_type: str, obj: dict[str, Any], patch: Any) -> dict[str, Any]:
    """The object after the patch; strategic merge is treated as a merge patch."""
    if content_type == JSON_PATCH:
        if not isinstance(patch, list):
            raise TypeError("a JSON patch must be a list of operations")
        return _json_patch(copy.deepcopy(obj), patch)
    if not isinstance(patch, dict):
        raise TypeError("a merge patch must be a JSON object")
    merged = _merge(obj, patch)
    assert isinstance(merged, dict)
    return merged


def _merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"JSON pointer {path!r} must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], path: str) -> Any:
    node = doc
    for part in parts[:-1]:
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError, TypeError):
            raise PatchError(f"path {path!r} does not exist") from None
    return node


def _get(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        return doc
    parent = _parent(doc, parts, path)
    try:
        return parent[int(parts[-1])] if isinstance(parent, list) else parent[parts[-1]]
    except (KeyError, IndexError, ValueError, TypeError):
        raise PatchError(f"path {path!r} does not exist") from None


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    parent = _parent(doc, parts, path)
    value = _get(doc, path)
    if isinstance(parent, list):
        parent.pop(int(parts[-1]))
    else:
        del parent[parts[-1]]
    return value


def _add(doc: Any, path: str, value: Any, replace: bool) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent = _parent(doc, parts, path)
    key = parts[-1]
    if isinstance(parent, list):
        index = len(parent) if key == "-" else int(key)
        if replace:
            _get(doc, path)
            parent[index] = value
        elif 0 <= index <= len(parent):
            parent.insert(index, value)
        else:
            raise PatchError(f"index {index} out of range in {path!r}")
    elif isinstance(parent, dict):
        if replace and key not in parent:
            raise PatchError(f"path {path!r} does not exist")
        parent[key] = value
    else:
        raise PatchError(f"path {path!r} does not name an object member or array element")
    return doc


def _json_patch(doc: Any, ops: list[Any]) -> dict[str, Any]:
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise TypeError("each JSON patch operation needs 'op' and 'path'")
        kind, path = op["op"], op["path"]
        if kind in ("add", "replace", "test") and "value" not in op:
            raise TypeError(f"JSON patch operation {kind!r} needs 'value'")
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op["value"]), replace=False)
        elif kind == "replace":
            doc = _add(doc, path, copy.deepcopy(op["value"]), replace=True)
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "test":
            if _get(doc, path) != op["value"]:
                raise PatchError(f"testing value {path} failed")
        elif kind in ("move", "copy"):
            value = _remove(doc, op["from"]) if kind == "move" else _get(doc, op["from"])
            doc = _add(doc, path, copy.deepcopy(value), replace=False)
        else:
            raise TypeError(f"unknown JSON patch operation {kind!r}")
    if not isinstance(doc, dict):
        raise PatchError("the patched document is not an object")
    return doc


# Field selectors the real API server accepts per resource (others are rejected with 400).
FIELD_LABELS: dict[str, frozenset[str]] = {
    "pods": frozenset(
        {
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "spec.schedulerName",
            "spec.restartPolicy",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        }
    ),
    "nodes": frozenset({"metadata.name", "spec.unschedulable"}),
}
_DEFAULT_FIELDS = frozenset({"metadata.name", "metadata.namespace"})


def _field_value(obj: dict[str, Any], field: str) -> str:
    node: Any = obj
    for part in field.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


def field_matcher(resource: str, selector: str) -> Any:
    """A predicate for `fieldSelector` (`k=v`, `k==v`, `k!=v`, comma-separated)."""
    terms = []
    for raw in filter(None, (t.strip() for t in selector.split(","))):
        match = re.fullmatch(r"([^=!]+)(==|=|!=)(.*)", raw)
        if not match:
            raise SelectorError(f"invalid field selector term {raw!r}")
        field, op, value = match.group(1).strip(), match.group(2), match.group(3).strip()
        if field not in FIELD_LABELS.get(resource, _DEFAULT_FIELDS):
            raise SelectorError(f'field label not supported: "{field}"')
        terms.append((field, op == "!=", value))

    def matches(obj: dict[str, Any]) -> bool:
        return all((_field_value(obj, f) == v) != negate for f, negate, v in terms)

    return matches


def _split_terms(selector: str) -> list[str]:
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(selector):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            terms.append(selector[start:i])
            start = i + 1
    terms.append(selector[start:])
    return [t.strip() for t in terms if t.strip()]


_SET_TERM = re.compile(r"([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)")
_EQ_TERM = re.compile(r"([\w./-]+)\s*(==|=|!=)\s*([\w.-]*)")
_EXISTS_TERM = re.compile(r"(!?)\s*([\w./-]+)")


def label_matcher(selector: str) -> Any:
    """A predicate for `labelSelector`: equality, `!=`, `in`, `notin`, existence, `!key`."""
    checks = []
    for term in _split_terms(selector):
        if m := _SET_TERM.fullmatch(term):
            values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
            checks.append((m.group(1), m.group(2), values))
        elif m := _EQ_TERM.fullmatch(term):
            op = "in" if m.group(2) in ("=", "==") else "notin"
            checks.append((m.group(1), op, frozenset({m.group(3)})))
        elif m := _EXISTS_TERM.fullmatch(term):
            checks.append((m.group(2), "absent" if m.group(1) else "exists", frozenset()))
        else:
            raise SelectorError(f"unable to parse requirement: {term!r}")

    def matches(obj: dict[str, Any]) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        for key, op, values in checks:
            present = key in labels
            ok = {
                "in": present and labels.get(key) in values,
                "notin": not present or labels.get(key) not in values,
                "exists": present,
                "absent": not present,
            }[op]
            if not ok:
                return False
        return True

    return matches


def parse_json(body: bytes) -> Any:
    """JSON from a request body; ValueError when malformed."""
    try:
        return json.loads(body or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"malformed JSON body: {err}") from err

"""Request routing for the fake API server: paths to resources, verbs and store calls."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.harness.kubepatch import (
    PATCH_TYPES,
    SelectorError,
    field_matcher,
    label_matcher,
    parse_json,
)
from tests.harness.kubeprotobuf import PROTOBUF, read_binding
from tests.harness.kuberules import KINDS, NAMESPACED, ApiError, Obj
from tests.harness.kubestore import Key, Store

BINDING_SUCCESS: Obj = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Success",
    "code": 201,
}


@dataclass
class Route:
    """What a request addresses: resource, namespace (None: all), name and subresource."""

    resource: str
    namespace: str | None
    name: str = ""
    sub: str = ""
    query: dict[str, str] = field(default_factory=dict)
    bookmark_seq: int = 0

    @property
    def rbac_resource(self) -> str:
        return f"{self.resource}/{self.sub}" if self.sub else self.resource


def parse_route(path: str) -> Route:
    """Map an /api/v1 path to a Route; ApiError 404 for anything this server does not serve."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] != ["api", "v1"]:
        raise ApiError(404, "the server could not find the requested resource")
    rest = parts[2:]
    namespace: str | None = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if rest == ["bindings"] and namespace is not None:
        return Route("pods", namespace, "", "binding")
    if not rest or rest[0] not in KINDS or len(rest) > 3:
        raise ApiError(404, "the server could not find the requested resource")
    resource = rest[0]
    if (resource in NAMESPACED) != (namespace is not None) and len(rest) > 1:
        raise ApiError(404, "the server could not find the requested resource")
    name, sub = [*rest[1:], "", ""][:2]
    return Route(resource, namespace, name, sub)


def verb_of(method: str, route: Route) -> str:
    if method == "GET" and not route.name:
        return "watch" if route.query.get("watch") in ("true", "1") else "list"
    verbs = {"GET": "get", "POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}
    if route.sub and not (route.sub == "status" or (route.sub == "binding" and method == "POST")):
        raise ApiError(404, "the server could not find the requested resource")
    if method == "POST" and route.name and route.sub != "binding":
        raise ApiError(405, f"POST is not supported on a single {route.resource} object")
    return verbs[method]


def matcher(route: Route) -> Callable[[Obj], bool]:
    try:
        fields = field_matcher(route.resource, route.query.get("fieldSelector", ""))
        labels = label_matcher(route.query.get("labelSelector", ""))
    except SelectorError as err:
        raise ApiError(400, str(err)) from err
    return lambda obj: bool(fields(obj) and labels(obj))


def _body(raw: bytes, content_type: str | None = None) -> Any:
    if (content_type or "").split(";")[0].strip() == PROTOBUF:
        return read_binding(raw)
    try:
        return parse_json(raw)
    except ValueError as err:
        raise ApiError(400, str(err)) from err


def handle(
    store: Store, verb: str, route: Route, raw: bytes, content_type: str | None
) -> tuple[int, Obj]:
    ns = route.namespace or ""
    if verb == "list":
        return 200, _list(store, route)
    if verb == "get":
        obj = store.get(route.resource, ns, route.name)
        return 200, ({"status": obj.get("status", {}), **obj} if route.sub else obj)
    if verb == "create" and route.sub == "binding":
        binding = _body(raw, content_type)
        name = route.name or (binding.get("metadata") or {}).get("name", "")
        store.bind(ns, name, binding)
        return 201, {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "code": 201,
        }
    if verb == "create":
        dry_run = route.query.get("dryRun") == "All"
        return 201, store.create(route.resource, ns, _body(raw), dry_run)
    if verb == "patch":
        media = (content_type or "").split(";")[0].strip()
        if media not in PATCH_TYPES:
            raise ApiError(
                415,
                "the body of the request was in an unknown format - accepted"
                f" media types include: {', '.join(PATCH_TYPES)}",
            )
        return 200, store.patch(route.resource, ns, route.name, media, _body(raw), route.sub)
    if verb == "update":
        body = _body(raw)
        if not isinstance(body, dict):
            raise ApiError(400, f"the body of the request is not a {KINDS[route.resource]} object")
        return 200, store.replace(route.resource, ns, route.name, body, route.sub)
    grace = route.query.get("gracePeriodSeconds")
    if grace is None and raw:
        grace = _body(raw).get("gracePeriodSeconds")
    return 200, store.delete(route.resource, ns, route.name, None if grace is None else int(grace))


def _list(store: Store, route: Route) -> Obj:
    page = store.list_page(
        route.resource,
        route.namespace,
        matcher(route),
        int(route.query.get("limit") or 0),
        _continued(route.query.get("continue")),
    )
    meta: Obj = {"resourceVersion": str(page.rv)}
    if page.next_key is not None:
        token = {"v": "meta.k8s.io/v1", "rv": page.rv, "start": page.next_key + "\x00"}
        meta["continue"] = base64.b64encode(json.dumps(token).encode()).decode()
        if not route.query.get("fieldSelector") and not route.query.get("labelSelector"):
            meta["remainingItemCount"] = page.remaining  # unknown to a real server otherwise
    for item in page.items:
        item.pop("kind", None)
        item.pop("apiVersion", None)
    kind = KINDS[route.resource] + "List"
    return {"kind": kind, "apiVersion": "v1", "metadata": meta, "items": page.items}


def _continued(token: str | None) -> tuple[int, Key] | None:
    """The first page's resourceVersion and the key the next page starts from, from a continue
    token shaped like the real server's (`{"v", "rv", "start": "<last key>\\0"}`, base64)."""
    if not token:
        return None
    try:
        fields = json.loads(base64.b64decode(token))
        return int(fields["rv"]), str(fields["start"])
    except (ValueError, KeyError, TypeError) as err:
        raise ApiError(400, "continue key is not valid") from err

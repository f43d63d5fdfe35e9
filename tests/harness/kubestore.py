"""The fake API server's object store: core/v1 semantics, resourceVersions and watch history."""

from __future__ import annotations

import bisect
import copy
import secrets
import string
import threading
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tests.harness.kubepatch import PatchError, apply_patch
from tests.harness.kuberules import (
    KINDS,
    NAMESPACED,
    RESOURCE_OF_KIND,
    ApiError,
    Obj,
    binding_target,
    check_binding,
    check_update,
    not_found,
)

Matcher = Callable[[Obj], bool]


SNAPSHOTS_KEPT = 16
"""Paged lists whose snapshot a continue token can still read; an older token gets 410, as a
real server's does once etcd compacted its revision."""
TOO_OLD_CONTINUE = (
    "The provided continue parameter is too old to display a consistent list result. You can"
    " start a new list without the continue parameter, or use the continue token in this response"
    " to retrieve the remainder of the results. Continuing with the provided token results in an"
    " inconsistent list - objects that were created, modified, or deleted between the time the"
    " first chunk was returned and now may show up in the list."
)


Key = str
"""`<namespace>/<name>`, or `<name>` for a cluster-scoped object: an object's etcd key under its
resource's prefix, the order lists come in."""


@dataclass
class Page:
    """One page of a list: its items, the list's resourceVersion, and where the next page
    starts after (the last key served; None on the last page) with how many matching items
    remain."""

    items: list[Obj]
    rv: int
    next_key: Key | None = None
    remaining: int = 0


@dataclass
class _Snapshot:
    keys: list[Key]
    objects: list[Obj]


@dataclass(frozen=True)
class Change:
    """One committed write: the object before (None when created) and after (None when deleted)."""

    rv: int
    resource: str
    type: str
    old: Obj | None
    new: Obj | None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Store:
    """Objects keyed by (resource, namespace, name), with a global resourceVersion counter."""

    def __init__(self, history_limit: int = 1000) -> None:
        self.cond = threading.Condition()
        self._objects: dict[tuple[str, str, str], Obj] = {}
        self._rv = 0
        self._history: deque[Change] = deque()
        self._history_limit = history_limit
        self._compacted = 0
        self._snapshots: OrderedDict[tuple[str, int], _Snapshot] = OrderedDict()
        self.bookmark_seq = 0

    def request_bookmarks(self) -> None:
        """Ask every bookmark-enabled watch to send a BOOKMARK."""
        with self.cond:
            self.bookmark_seq += 1
            self.cond.notify_all()

    @property
    def resource_version(self) -> int:
        with self.cond:
            return self._rv

    def _commit(self, resource: str, kind: str, old: Obj | None, new: Obj | None) -> Obj:
        self._rv += 1
        target = new if new is not None else copy.deepcopy(old)
        assert target is not None
        target.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
        meta = target["metadata"]
        key = (resource, meta.get("namespace", ""), meta["name"])
        if new is None:
            self._objects.pop(key, None)
        else:
            self._objects[key] = new
        after = copy.deepcopy(new) if new is not None else None
        self._history.append(Change(self._rv, resource, kind, copy.deepcopy(old), after))
        while len(self._history) > self._history_limit:
            self._compacted = self._history.popleft().rv
        self.cond.notify_all()
        return copy.deepcopy(target)

    def compact(self) -> None:
        """Forget every retained change, so watches from older resourceVersions get 410 Gone,
        and every list snapshot, so continue tokens do too."""
        with self.cond:
            self._history.clear()
            self._snapshots.clear()
            self._compacted = self._rv

    def changes_after(self, rv: int) -> list[Change]:
        """Retained changes newer than rv; ApiError 410 when some were already forgotten."""
        with self.cond:
            if rv < self._compacted:
                raise ApiError(
                    410, f"too old resource version: {rv} ({self._compacted + 1})", reason="Expired"
                )
            return [c for c in self._history if c.rv > rv]

    def create(self, resource: str, namespace: str, body: Any, dry_run: bool = False) -> Obj:
        """POST semantics: defaults, uid, timestamps; 409 AlreadyExists on a taken name."""
        if not isinstance(body, dict):
            raise ApiError(400, f"the body of the request is not a {KINDS[resource]} object")
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {}) or {}
        obj["metadata"] = meta
        if not meta.get("name") and meta.get("generateName"):
            suffix = "".join(
                secrets.choice(string.ascii_lowercase + string.digits) for _ in "12345"
            )
            meta["name"] = meta["generateName"] + suffix
        if not meta.get("name"):
            raise ApiError(422, f'{KINDS[resource]} "" is invalid: metadata.name: Required value')
        if resource in NAMESPACED:
            if meta.get("namespace", namespace) != namespace:
                raise ApiError(
                    400,
                    "the namespace of the provided object does not match the namespace sent on"
                    " the request",
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        obj["kind"], obj["apiVersion"] = KINDS[resource], "v1"
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now())
        meta.pop("resourceVersion", None)
        if resource == "pods":
            obj.setdefault("status", {}).setdefault("phase", "Pending")
        with self.cond:
            if (
                resource,
                namespace if resource in NAMESPACED else "",
                meta["name"],
            ) in self._objects:
                message = f'{resource} "{meta["name"]}" already exists'
                raise ApiError(409, message, reason="AlreadyExists", name=meta["name"])
            if dry_run:
                return obj
            return self._commit(resource, "ADDED", None, obj)

    def _current(self, resource: str, namespace: str, name: str) -> Obj:
        key = (resource, namespace if resource in NAMESPACED else "", name)
        if key not in self._objects:
            raise not_found(resource, name)
        return self._objects[key]

    def get(self, resource: str, namespace: str, name: str) -> Obj:
        with self.cond:
            return copy.deepcopy(self._current(resource, namespace, name))

    def list(self, resource: str, namespace: str | None, match: Matcher) -> tuple[list[Obj], int]:
        """Matching objects in key order and the list's resourceVersion."""
        page = self.list_page(resource, namespace, match)
        return page.items, page.rv

    def list_page(
        self,
        resource: str,
        namespace: str | None,
        match: Matcher,
        limit: int = 0,
        after: tuple[int, Key] | None = None,
    ) -> Page:
        """At most `limit` (0: all) matching objects in key order.

        A continuation (`after`: the first page's resourceVersion and the key to start from)
        reads the snapshot the first page read, as the real server reads etcd at that revision:
        the pages of one list never skip or repeat an object, whatever changed between them,
        and a watch from the list's resourceVersion sees every later change. 410 once that
        snapshot is gone.
        """
        with self.cond:
            if after is None:
                rv, start = self._rv, 0
                snapshot = self._snapshot(resource)
            else:
                rv, first = after
                found = self._snapshots.get((resource, rv))
                if found is None:
                    raise ApiError(410, TOO_OLD_CONTINUE, reason="Expired")
                self._snapshots.move_to_end((resource, rv))
                snapshot, start = found, bisect.bisect_left(found.keys, first)
        prefix = f"{namespace}/" if namespace is not None else ""
        page = Page([], rv)
        for key, obj in zip(snapshot.keys[start:], snapshot.objects[start:], strict=True):
            if not key.startswith(prefix) or not match(obj):
                continue
            if limit and len(page.items) == limit:
                page.remaining += 1
                continue
            page.items.append(copy.deepcopy(obj))
            page.next_key = key
        if page.remaining == 0:
            page.next_key = None
        elif after is None:
            self._keep(resource, rv, snapshot)
        return page

    def _snapshot(self, resource: str) -> _Snapshot:
        """The resource's objects now, in key order (stored objects are replaced on every
        change, never edited, so the snapshot holds them without copying)."""
        found = sorted(
            (f"{ns}/{name}" if ns else name, obj)
            for (res, ns, name), obj in self._objects.items()
            if res == resource
        )
        return _Snapshot([key for key, _ in found], [obj for _, obj in found])

    def _keep(self, resource: str, rv: int, snapshot: _Snapshot) -> None:
        with self.cond:
            self._snapshots[(resource, rv)] = snapshot
            self._snapshots.move_to_end((resource, rv))
            while len(self._snapshots) > SNAPSHOTS_KEPT:
                self._snapshots.popitem(last=False)

    def patch(
        self, resource: str, namespace: str, name: str, content_type: str, patch: Any, sub: str = ""
    ) -> Obj:
        """Apply a patch; 409 when it carries a stale resourceVersion."""
        with self.cond:
            current = self._current(resource, namespace, name)
            try:
                new = apply_patch(content_type, current, patch)
            except PatchError as err:
                raise ApiError(422, str(err)) from err
            except TypeError as err:
                raise ApiError(400, str(err)) from err
            if sub == "status":
                new = {**copy.deepcopy(current), "status": new.get("status", {})}
            check_update(resource, current, new)
            if current == new:
                return copy.deepcopy(current)
            return self._commit(resource, "MODIFIED", current, new)

    def replace(self, resource: str, namespace: str, name: str, body: Obj, sub: str = "") -> Obj:
        """PUT semantics: the body replaces the object; a stale resourceVersion is a 409."""
        with self.cond:
            current = self._current(resource, namespace, name)
            new = copy.deepcopy(body)
            new["kind"], new["apiVersion"] = KINDS[resource], "v1"
            if (new.get("metadata") or {}).get("name") != name:
                raise ApiError(400, "the name of the object does not match the name on the URL")
            if sub == "status":
                new = {**copy.deepcopy(current), "status": new.get("status", {})}
            check_update(resource, current, new)
            return self._commit(resource, "MODIFIED", current, new)

    def delete(self, resource: str, namespace: str, name: str, grace: int | None) -> Obj:
        """Delete; a bound pod with a grace period is only marked terminating, as kubelet would."""
        with self.cond:
            current = self._current(resource, namespace, name)
            bound = resource == "pods" and current.get("spec", {}).get("nodeName")
            if bound and (grace is None or grace > 0):
                if current["metadata"].get("deletionTimestamp"):
                    return copy.deepcopy(current)
                new = copy.deepcopy(current)
                seconds = grace if grace is not None else 30
                new["metadata"].update(deletionTimestamp=_now(), deletionGracePeriodSeconds=seconds)
                return self._commit(resource, "MODIFIED", current, new)
            return self._commit(resource, "DELETED", current, None)

    def bind(self, namespace: str, name: str, binding: Any) -> None:
        """The pods/binding subresource: set spec.nodeName once."""
        node = binding_target(name, binding)
        meta = binding.get("metadata") or {}
        with self.cond:
            current = self._current("pods", namespace, name)
            check_binding(name, binding, current)
            new = copy.deepcopy(current)
            new.setdefault("spec", {})["nodeName"] = node
            annotations = meta.get("annotations") or {}
            if annotations:
                new["metadata"].setdefault("annotations", {}).update(annotations)
            conditions = new.setdefault("status", {}).setdefault("conditions", [])
            conditions.append(
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()}
            )
            self._commit("pods", "MODIFIED", current, new)

    def put(self, obj: Obj) -> Obj:
        """Create or overwrite an object directly, bypassing validation (test setup)."""
        resource = RESOURCE_OF_KIND[obj["kind"]]
        new = copy.deepcopy(obj)
        new["apiVersion"] = "v1"
        meta = new.setdefault("metadata", {})
        if resource in NAMESPACED:
            meta.setdefault("namespace", "default")
        with self.cond:
            key = (resource, meta.get("namespace", ""), meta["name"])
            old = self._objects.get(key)
            meta.setdefault("uid", old["metadata"]["uid"] if old else str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", _now())
            return self._commit(resource, "MODIFIED" if old else "ADDED", old, new)

    def remove(self, resource: str, namespace: str, name: str) -> Obj:
        """Delete at once, whatever the object's state (test control)."""
        with self.cond:
            return self._commit(resource, "DELETED", self._current(resource, namespace, name), None)

"""Watch streams for the fake API server: chunked JSON lines of ADDED/MODIFIED/DELETED events."""

from __future__ import annotations

import copy
import functools
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tests.harness.kuberules import KINDS, ApiError, Obj
from tests.harness.kubestore import Change, Store

if TYPE_CHECKING:
    from tests.harness.kuberoutes import Route

DEFAULT_TIMEOUT_S = 1800.0


def event_for(change: Change, route: Route, match: Callable[[Obj], bool]) -> Obj | None:
    """The event a watch on route sees for change (objects leaving the selection are DELETED)."""
    if change.resource != route.resource:
        return None

    def selected(obj: Obj | None) -> bool:
        if obj is None:
            return False
        in_ns = route.namespace is None or obj["metadata"].get("namespace") == route.namespace
        return in_ns and match(obj)

    was, now = selected(change.old), selected(change.new)
    if now:
        return {"type": "MODIFIED" if was else "ADDED", "object": change.new}
    if not was:
        return None
    gone = copy.deepcopy(change.new if change.new is not None else change.old)
    assert gone is not None
    gone["metadata"]["resourceVersion"] = str(change.rv)
    return {"type": "DELETED", "object": gone}


class _Stream:
    """Chunked writer on the handler's socket."""

    def __init__(self, handler: Any) -> None:
        self.handler = handler
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()

    def send(self, event: Obj) -> None:
        data = json.dumps(event).encode() + b"\n"
        self.handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.handler.wfile.flush()

    def close(self) -> None:
        self.handler.wfile.write(b"0\r\n\r\n")
        self.handler.wfile.flush()


def serve(handler: Any, store: Store, route: Route, match: Callable[[Obj], bool]) -> None:
    """Stream events for route until timeoutSeconds, server stop, or client disconnect."""
    query = route.query
    timeout = float(query.get("timeoutSeconds") or DEFAULT_TIMEOUT_S)
    bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
    start = query.get("resourceVersion", "")
    if start not in ("", "0") and not start.isdigit():
        raise ApiError(400, f"resourceVersion: Invalid value: {start!r}")
    handler.close_connection = True
    stream = _Stream(handler)
    try:
        _pump(handler, stream, store, route, match, start, timeout, bookmarks)
        stream.close()
    except (BrokenPipeError, ConnectionResetError, OSError):
        pass


def _pump(
    handler: Any,
    stream: _Stream,
    store: Store,
    route: Route,
    match: Callable[[Obj], bool],
    start: str,
    timeout: float,
    bookmarks: bool,
) -> None:
    deadline = time.monotonic() + timeout
    seen_bookmarks = route.bookmark_seq
    if start in ("", "0"):
        items, cursor = store.list(route.resource, route.namespace, match)
        for item in items:
            stream.send({"type": "ADDED", "object": item})
    else:
        cursor = int(start)
    while True:
        with store.cond:  # the changes and "nothing newer" are read in one hold of the lock
            try:
                changes = store.changes_after(cursor)
            except ApiError as err:
                stream.send({"type": "ERROR", "object": err.status()})
                return
            if not changes:
                cursor = max(cursor, store.resource_version)
        for change in changes:
            event = event_for(change, route, match)
            cursor = change.rv
            if event is not None:
                stream.send(event)
        with store.cond:
            seq = store.bookmark_seq
            if bookmarks and seq != seen_bookmarks:
                seen_bookmarks = seq
                meta = {"resourceVersion": str(cursor)}
                kind = KINDS[route.resource]
                stream.send(
                    {
                        "type": "BOOKMARK",
                        "object": {"kind": kind, "apiVersion": "v1", "metadata": meta},
                    }
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0 or handler.server.stopping:
                return
            woken = functools.partial(_woken, handler, store, cursor, seen_bookmarks)
            store.cond.wait_for(woken, remaining)


def _woken(handler: Any, store: Store, cursor: int, seen_bookmarks: int) -> bool:
    stopping = bool(handler.server.stopping)
    return stopping or store.resource_version > cursor or store.bookmark_seq != seen_bookmarks

"""One list+watch loop for every daemon: a paged list, a watch from its resourceVersion, a relist
when the history is gone (410), backoff on errors, the outage said once, and a prompt stop.

Each daemon keeps its own store (`Store`): the reflector hands it the full set after every list
(`replace`, so it can drop what vanished) and each ADDED/MODIFIED/DELETED object after that
(`apply`). Bodies are read by a decoder (orjson by default), one watch line at a time.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import socket
import threading
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import orjson

from baton.contract.kube import Outage, api_error_reason, watch_events

log = logging.getLogger(__name__)

PAGE = 500
REQUEST_TIMEOUT_S = 10.0
"""A list page's answer, and a connection to the API server, must come within this."""
WATCH_TIMEOUT_S = 300
APPLIED = frozenset(("ADDED", "MODIFIED", "DELETED"))


class WatchEvent(NamedTuple):
    """One change to a watched object: `type` is ADDED, MODIFIED or DELETED."""

    type: str
    object: dict[str, Any]


class Store(Protocol):
    """What a daemon keeps of the watched objects."""

    def replace(self, objects: list[dict[str, Any]], resource_version: str) -> None:
        """A list's full set: what is not in it has vanished."""

    def apply(self, event: WatchEvent) -> None:
        """One change seen by the watch."""


class Source(Protocol):
    """Raw (unread, `_preload_content=False`) responses of one kind's list pages and watches."""

    def list(self, limit: int, continue_token: str, timeout_s: float) -> Any: ...

    def watch(self, resource_version: str, timeout_s: int, request_timeout_s: float) -> Any: ...

    def abort(self) -> None:
        """End every request in flight and any made later (from any thread)."""

    def close(self) -> None: ...


class ApiError(Exception):
    """The API server answered with an error status (an HTTP status or a watch's ERROR event)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"API server answered {code}: {message}")
        self.status = code


class Backoff:
    """Delays that double from `first_s` up to `cap_s`; `reset()` after a success."""

    def __init__(self, first_s: float = 0.2, cap_s: float = 5.0) -> None:
        self.first_s, self.cap_s = first_s, cap_s
        self._next = first_s

    def next(self) -> float:
        delay, self._next = self._next, min(self._next * 2, self.cap_s)
        return delay

    def reset(self) -> None:
        self._next = self.first_s


class _StoreFailed(Exception):
    """The store raised on what the API server sent (a bug, said with its traceback)."""


def _status_of(err: BaseException) -> int | None:
    status = getattr(err, "status", None)
    return status if isinstance(status, int) else None


class Reflector:
    """Lists and watches one kind of object into `store`, in a thread of its own, until stopped."""

    def __init__(
        self,
        source: Source,
        store: Store,
        outage: Outage,
        *,
        name: str = "reflector",
        decode: Callable[[bytes], Any] = orjson.loads,
        on_restart: Callable[[str], None] = lambda why: None,
        refused: Callable[[Exception], float | None] = lambda err: None,
        watching: Callable[[], None] = lambda: None,
        backoff: Backoff | None = None,
        sleep: Callable[[float], object] | None = None,
        page: int = PAGE,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
    ) -> None:
        """`on_restart(why)` hears every error the loop recovers from (for metrics); `sleep`
        waits out a backoff (by default a wait that `stop` cuts short); `refused(err)`, for an
        error that retrying soon cannot mend (a role without the verb, until it is granted),
        gives the seconds to wait before listing again, without a backoff or an outage said (it
        is called from the loop's thread, and tells the caller itself); None for any other.
        `watching()` hears each watch the API server answers (from the loop's thread)."""
        self.source, self.store, self.outage = source, store, outage
        self._refused = refused
        self._watching = watching
        self._decode = decode
        self._on_restart = on_restart
        self._backoff = backoff or Backoff()
        self._stopping = threading.Event()
        self._sleep = sleep or self._stopping.wait
        self._page = page
        self._request_timeout_s = request_timeout_s
        self._watch_timeout_s = watch_timeout_s
        self.resource_version = ""
        """The version the next watch starts from; "" until listed, and again when it is gone."""
        self._gone_in_a_row = False
        self._thread = threading.Thread(target=self.run, name=name, daemon=True)

    def start(self) -> Reflector:
        """Start listing and watching in the background."""
        self._thread.start()
        return self

    def stop(self, timeout_s: float | None = None) -> bool:
        """Stop: end the request in flight and wait (bounded) for the thread; whether it ended.

        The thread must be gone before the interpreter exits: a daemon thread that wakes from a
        socket read while the interpreter finalizes aborts the process (SIGABRT).
        """
        self._stopping.set()
        self.source.abort()
        if self._thread.is_alive():
            self._thread.join(self._request_timeout_s + 1.0 if timeout_s is None else timeout_s)
        if self._thread.is_alive():
            log.warning("%s: the watch did not stop in time", self.outage.what)
            return False
        self.source.close()
        return True

    def list_now(self) -> list[dict[str, Any]]:
        """One paged list handed to the store at once, from the caller's thread (a cache miss);
        errors go to the caller."""
        objects, version = self._list()
        self.store.replace(objects, version)
        return objects

    def run(self) -> None:
        """The loop: list, watch, and recover, until `stop`."""
        while not self._stopping.is_set():
            try:
                if not self.resource_version:
                    objects, version = self._list()
                    try:
                        self.store.replace(objects, version)
                    except Exception as err:
                        raise _StoreFailed(f"the store failed on a list: {err!r}") from err
                    self.resource_version = version
                    self._answered()
                self._watch()
            except Exception as err:
                if self._stopping.is_set():
                    return
                retry_s = self._refused(err)
                if retry_s is None:
                    self._recover(err)
                else:
                    self.resource_version = ""
                    self._sleep(retry_s)

    def _recover(self, err: Exception) -> None:
        """Relist at once when the history is gone (once in a row); else back off, then resume
        the watch from the last version seen (relist if the list or the store failed)."""
        why = _reason(err)
        self._on_restart(why)
        gone = _status_of(err) == 410
        if gone or isinstance(err, _StoreFailed):
            self.resource_version = ""
        if gone and not self._gone_in_a_row:
            self._gone_in_a_row = True
            return
        delay = self._backoff.next()
        if isinstance(err, _StoreFailed):
            log.error("%s: %s; relisting", self.outage.what, why, exc_info=err.__cause__)
        else:
            self.outage.failed(why, delay)
        self._sleep(delay)

    def _list(self) -> tuple[list[dict[str, Any]], str]:
        objects: list[dict[str, Any]] = []
        token = ""
        while True:
            page = self._read(self.source.list(self._page, token, self._request_timeout_s))
            objects += page.get("items") or []
            meta = page.get("metadata") or {}
            token = meta.get("continue") or ""
            if not token:
                return objects, str(meta.get("resourceVersion") or "")

    def _read(self, response: Any) -> Any:
        try:
            return self._decode(response.data)
        finally:
            response.release_conn()

    def _watch(self) -> None:
        """Apply one watch's events until the server ends it (then the next resumes from the
        last version seen); an error event raises."""
        response = self.source.watch(
            self.resource_version, self._watch_timeout_s, self._request_timeout_s
        )
        self._watching()
        apply = self.store.apply
        healthy = False
        try:
            for event in watch_events(response, self._decode):
                kind, obj = event.get("type"), event.get("object") or {}
                if kind in APPLIED:
                    try:
                        apply(WatchEvent(kind, obj))
                    except Exception as err:
                        raise _StoreFailed(f"the store failed on an event: {err!r}") from err
                elif kind == "ERROR":
                    raise ApiError(int(obj.get("code") or 0), str(obj.get("message") or obj))
                elif kind != "BOOKMARK":
                    continue
                self.resource_version = str(
                    (obj.get("metadata") or {}).get("resourceVersion") or self.resource_version
                )
                if not healthy:  # not at the watch's start: a failing server answers too
                    healthy, self._gone_in_a_row = True, False
                    self._answered()
        finally:
            response.release_conn()
        self._answered()

    def _answered(self) -> None:
        self.outage.answered()
        self._backoff.reset()


def _reason(err: BaseException) -> str:
    """One line: what the API server answered, why it could not be reached, or what failed."""
    if isinstance(err, (ApiError, _StoreFailed)):
        return str(err)
    if isinstance(err, ValueError):
        return f"the API server's answer is unreadable ({err})"
    return api_error_reason(err)


KINDS = ("nodes", "pods", "resourceclaims", "resourceslices")
_DRA_API = "Kubernetes serves it from 1.34 on, unless its API group is turned off"


class KubeSource:
    """Nodes, pods, or DRA's ResourceClaims or ResourceSlices (`resource.k8s.io/v1`) through
    the Kubernetes client, on a client of its own: no retries (the reflector backs off itself)
    and every connection it opens can be cut by `abort`."""

    def __init__(
        self,
        api_client: Any,
        resource: str,
        *,
        namespace: str | None = None,
        field_selector: str = "",
        label_selector: str = "",
    ) -> None:
        from kubernetes import client

        configuration = copy.copy(api_client.configuration)
        configuration.retries = False
        self._api = client.ApiClient(configuration)
        self._aborted = threading.Event()
        self._live: weakref.WeakSet[Any] = weakref.WeakSet()
        _track_connections(self._api, self._live, self._aborted)
        core = client.CoreV1Api(self._api)
        dra = client.ResourceV1Api(self._api)
        call: Callable[..., Any]
        if resource == "nodes":
            call = core.list_node
        elif resource == "pods":
            call = core.list_pod_for_all_namespaces
            if namespace:
                call = functools.partial(core.list_namespaced_pod, namespace)
        elif resource == "resourceclaims":
            call = dra.list_resource_claim_for_all_namespaces
            if namespace:
                call = functools.partial(dra.list_namespaced_resource_claim, namespace)
        elif resource == "resourceslices":
            call = dra.list_resource_slice
        else:
            raise ValueError(f"cannot watch {resource!r}: {', '.join(KINDS)}")
        self._call: Callable[..., Any] = call
        self._not_served = (
            f"it serves no v1 {resource}"
            if resource in ("nodes", "pods")
            else f"it serves no resource.k8s.io/v1 {resource} ({_DRA_API})"
        )
        selectors = {"field_selector": field_selector, "label_selector": label_selector}
        self._selectors: dict[str, Any] = {key: value for key, value in selectors.items() if value}

    def list(self, limit: int, continue_token: str, timeout_s: float) -> Any:
        """A page of the list; `ApiError` 404 naming the API when the server does not serve
        it (a cluster without DRA's v1 API answers a bare `404 page not found`)."""
        extra = {"_continue": continue_token} if continue_token else {}
        try:
            return self._call(
                limit=limit,
                _preload_content=False,
                _request_timeout=timeout_s,
                **self._selectors,
                **extra,
            )
        except Exception as err:
            if _status_of(err) == 404:
                raise ApiError(404, self._not_served) from err
            raise

    def watch(self, resource_version: str, timeout_s: int, request_timeout_s: float) -> Any:
        return self._call(
            watch=True,
            resource_version=resource_version,
            timeout_seconds=timeout_s,
            allow_watch_bookmarks=True,
            _preload_content=False,
            _request_timeout=(request_timeout_s, timeout_s + request_timeout_s),
            **self._selectors,
        )

    def abort(self) -> None:
        self._aborted.set()
        for conn in list(self._live):
            _shut(getattr(conn, "sock", None))

    def close(self) -> None:
        self._api.close()


def _shut(sock: socket.socket | None) -> None:
    """Unblock a thread reading this socket (closing it from here could deadlock)."""
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _track_connections(api: Any, live: weakref.WeakSet[Any], aborted: threading.Event) -> None:
    """Record every connection the client's pool opens, so `abort` reaches a request still
    waiting for its answer (a response to interrupt exists only once its headers came)."""
    import urllib3
    from urllib3.connection import HTTPConnection, HTTPSConnection
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

    pool_manager = api.rest_client.pool_manager
    if type(pool_manager) is not urllib3.PoolManager:
        return  # through a proxy: a stop waits for the request timeout instead

    def tracked(base: type[HTTPConnection]) -> type[HTTPConnection]:
        class Tracked(base):  # type: ignore[valid-type,misc]
            def connect(self) -> None:
                super().connect()
                live.add(self)
                if aborted.is_set():
                    _shut(self.sock)

        return Tracked

    class Pool(HTTPConnectionPool):
        ConnectionCls = tracked(HTTPConnection)

    class TlsPool(HTTPSConnectionPool):
        ConnectionCls = tracked(HTTPSConnection)  # type: ignore[assignment]

    pool_manager.pool_classes_by_scheme = {"http": Pool, "https": TlsPool}

"""A fake Kubernetes API server: the core/v1 subset Baton uses, over real HTTP, for the real client.

Serves nodes, pods (with the binding and status subresources), events and configmaps: create, get,
list (field and label selectors, limit/continue over one snapshot), watch (chunked JSON lines,
bookmarks, 410 Gone), patch (merge, strategic merge treated as merge, JSON patch), replace and
delete. Test controls: start/stop on the same port, direct object access, fault injection and a
request log.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from baton.contract.quiet import QuietErrors
from tests.harness import fakewatch
from tests.harness.kuberoutes import handle, matcher, parse_route, verb_of
from tests.harness.kuberules import RESOURCE_OF_KIND, ApiError, Obj
from tests.harness.kubestore import Store


@dataclass(frozen=True)
class LoggedRequest:
    """One request as the server saw it; verb and resource are Kubernetes RBAC-style."""

    method: str
    path: str
    query: dict[str, str]
    verb: str
    resource: str


LOST = 0
"""A fault's code for "carried out, answer lost"."""
HANG = -1
"""A fault's code for "held unanswered until released" (a blackholed API server)."""
HANG_LIMIT_S = 60.0


@dataclass
class _Fault:
    verb: str
    resource: str
    code: int
    times: int
    message: str


class _HttpServer(QuietErrors, ThreadingHTTPServer):
    daemon_threads = True
    api: FakeApiServer
    stopping: bool = False


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out as separate writes; without TCP_NODELAY the body waits for the
    # client's delayed ACK (~40 ms per response on Linux loopback).
    disable_nagle_algorithm = True
    server: _HttpServer

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default stderr access log; the request log records requests."""

    def setup(self) -> None:
        super().setup()
        self.server.api._track(self.connection, add=True)

    def finish(self) -> None:
        self.server.api._track(self.connection, add=False)
        super().finish()

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        api = self.server.api
        try:
            route = parse_route(url.path)
            route.query, route.bookmark_seq = query, api.store.bookmark_seq
            verb = verb_of(method, route)
            api._record(LoggedRequest(method, url.path, query, verb, route.rbac_resource))
            lose_answer = api._maybe_fail(verb, route.rbac_resource)
            if verb == "watch":
                fakewatch.serve(self, api.store, route, matcher(route))
                return
            code, obj = handle(api.store, verb, route, body, self.headers.get("Content-Type"))
        except ApiError as err:
            code, obj = err.code, err.status()
        else:
            if lose_answer:  # carried out, and the connection dies before the answer
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
        self.send_json(code, obj)

    def send_json(self, code: int, obj: Obj) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class FakeApiServer:
    """The fake API server and its test controls; objects survive stop/start."""

    def __init__(self, history_limit: int = 1000) -> None:
        self.store = Store(history_limit)
        self._port = 0
        self._http: _HttpServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._logged = threading.Condition(self._lock)
        self._conns: set[socket.socket] = set()
        self.connections_accepted = 0
        """Client connections accepted since construction (a pooling client opens a few)."""
        self._log: list[LoggedRequest] = []
        self._faults: list[_Fault] = []
        self._released = threading.Event()

    def start(self) -> FakeApiServer:
        """Listen on 127.0.0.1 (an ephemeral port first, the same port after a stop)."""
        if self._http is not None:
            return self
        http = _HttpServer(("127.0.0.1", self._port), _Handler)
        http.api = self
        self._port = http.server_address[1]
        self._http = http
        self._thread = threading.Thread(
            target=http.serve_forever, args=(0.05,), name="fakeapi", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and drop every connection, ending all watches."""
        http, self._http = self._http, None
        if http is None:
            return
        http.stopping = True
        self._released.set()
        with self.store.cond:
            self.store.cond.notify_all()
        http.shutdown()
        http.server_close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def kubeconfig_path(self, tmp_dir: Path | str) -> Path:
        """Write a kubeconfig for the real client pointing at this server."""
        path = Path(tmp_dir) / "kubeconfig"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
            "current-context": "fake",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def put_object(self, obj: Obj) -> Obj:
        """Create or overwrite an object (by its `kind`) without validation; returns it stored."""
        return self.store.put(obj)

    def get_object(self, kind: str, name: str, namespace: str = "default") -> Obj | None:
        """The stored object, or None; kind is e.g. "Pod" or "Node"."""
        try:
            return self.store.get(RESOURCE_OF_KIND[kind], namespace, name)
        except ApiError:
            return None

    def remove_object(self, kind: str, name: str, namespace: str = "default") -> None:
        """Delete an object at once (a kubelet confirming a terminating pod, say)."""
        self.store.remove(RESOURCE_OF_KIND[kind], namespace, name)

    def wait_for_object(
        self,
        kind: str,
        name: str,
        predicate: Callable[[Obj | None], bool],
        namespace: str = "default",
        timeout: float = 10.0,
    ) -> Obj | None:
        """Block until the object (None when absent) satisfies predicate; TimeoutError after."""
        with self.store.cond:
            if not self.store.cond.wait_for(
                lambda: predicate(self.get_object(kind, name, namespace)), timeout
            ):
                raise TimeoutError(f"{kind} {namespace}/{name} did not reach the expected state")
            return self.get_object(kind, name, namespace)

    def fail_next(
        self, verb: str, resource: str, status_code: int, times: int = 1, message: str = ""
    ) -> None:
        """Fail the next `times` requests with this verb and resource (e.g. "pods/binding")."""
        text = message or f"injected failure for {verb} {resource}"
        with self._lock:
            self._faults.append(_Fault(verb, resource, status_code, times, text))

    def lose_answer_next(self, verb: str, resource: str, times: int = 1) -> None:
        """Carry out the next `times` such requests, then close the connection unanswered (an
        API server whose answer never arrives: the caller cannot tell what happened)."""
        with self._lock:
            self._faults.append(_Fault(verb, resource, LOST, times, ""))

    def hang_next(self, verb: str, resource: str, times: int = 1) -> None:
        """Hold the next `times` such requests unanswered (a blackholed API server: the caller
        waits for its own timeout) until `release_hangs`, `stop` or `HANG_LIMIT_S`."""
        with self._lock:
            self._released.clear()
            self._faults.append(_Fault(verb, resource, HANG, times, ""))

    def release_hangs(self) -> None:
        """Let held requests go on (answered, if their caller still waits)."""
        self._released.set()

    def requests(self, verb: str | None = None, resource: str | None = None) -> list[LoggedRequest]:
        """Logged requests, optionally only those with this verb and/or resource."""
        with self._lock:
            return [
                r
                for r in self._log
                if (verb is None or r.verb == verb) and (resource is None or r.resource == resource)
            ]

    def wait_for_requests(
        self, verb: str, resource: str, count: int = 1, timeout: float = 10.0
    ) -> list[LoggedRequest]:
        """Block until `count` requests with this verb and resource arrived (e.g. a watch)."""

        def matching() -> list[LoggedRequest]:
            return [r for r in self._log if r.verb == verb and r.resource == resource]

        with self._logged:
            if not self._logged.wait_for(lambda: len(matching()) >= count, timeout):
                raise TimeoutError(f"fewer than {count} {verb} {resource} requests arrived")
            return matching()

    def clear_requests(self) -> None:
        with self._lock:
            self._log.clear()

    def send_bookmarks(self) -> None:
        """Make every watch that allows bookmarks send one now."""
        self.store.request_bookmarks()

    @contextlib.contextmanager
    def atomically(self) -> Iterator[None]:
        """Make the changes inside the block appear to watchers as one step (they see none before
        the block ends); with compact_history() inside, a running watch gets 410 Gone."""
        with self.store.cond:
            yield

    def compact_history(self) -> None:
        """Forget the event history, so watches from older resourceVersions get 410 Gone."""
        self.store.compact()

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            (self._conns.add if add else self._conns.discard)(conn)
            self.connections_accepted += add

    def _record(self, request: LoggedRequest) -> None:
        with self._lock:
            self._log.append(request)
            self._logged.notify_all()

    def _maybe_fail(self, verb: str, resource: str) -> bool:
        """Raise the next injected failure of this request; True: lose its answer."""
        with self._lock:
            for fault in self._faults:
                if fault.verb == verb and fault.resource == resource and fault.times > 0:
                    fault.times -= 1
                    if fault.code == LOST:
                        return True
                    if fault.code == HANG:
                        break
                    raise ApiError(fault.code, fault.message)
            else:
                return False
        self._released.wait(HANG_LIMIT_S)
        return False

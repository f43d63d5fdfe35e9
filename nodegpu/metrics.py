"""Prometheus metrics of the device plugin and the HTTP server on :9461 that exposes them.

The same server takes fake health events when GPUs are fake:
`POST /fake/xid` with JSON `{"gpu": "<UUID or index>", "xid": 79}` reports an XID on that GPU
(ignored XIDs stay ignored), and `POST /fake/recover` with `{"gpu": ...}` marks it healthy again.
"""

from __future__ import annotations

import functools
import json
import logging
import reprlib
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from baton.contract import names
from baton.contract.quiet import QuietErrors
from nodegpu.health import HealthTracker
from nodegpu.inventory import Inventory

log = logging.getLogger(__name__)
_P = names.METRICS_PREFIX + "deviceplugin_"


class Metrics:
    """The device plugin's instruments, on a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.allocations = Counter(
            _P + "allocations", "Allocate calls by outcome.", ["outcome"], registry=r
        )
        self.allocate_seconds = Histogram(
            _P + "allocate_seconds",
            "Time to answer one Allocate call.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5),
            registry=r,
        )
        self.devices = Gauge(
            _P + "devices", "Advertised slot devices by health.", ["health"], registry=r
        )
        self.registrations = Counter(
            _P + "registrations",
            "Registrations with the kubelet by outcome.",
            ["outcome"],
            registry=r,
        )
        self.fallbacks = Counter(
            _P + "fallback_assignments",
            "Pods that reached the node without an assignment (their allocation is recorded).",
            registry=r,
        )
        self.reconciled = Counter(
            _P + "reconciled_pods",
            "Pods whose GPU annotations were written from the kubelet's allocation, by outcome "
            "(confirmed: as the extender proposed; corrected: the kubelet chose other GPUs; "
            "fallback: no proposal).",
            ["outcome"],
            registry=r,
        )
        self.unhealthy_gpus = Gauge(_P + "unhealthy_gpus", "GPUs marked unhealthy.", registry=r)
        self.unwatched_gpus = Gauge(
            _P + "unwatched_gpus",
            "GPUs whose health NVML does not report now (Unhealthy until it does).",
            registry=r,
        )
        self.health_watch_failures = Counter(
            _P + "health_watch_failures",
            "Failed attempts to watch GPU health through NVML (each retried with backoff).",
            registry=r,
        )
        self.allocations.labels(outcome="ok")  # shown from the start, not after the first call

    def observe_inventory(self, inventory: Inventory) -> None:
        """Update the device gauges from an inventory."""
        devices = inventory.devices()
        healthy = sum(1 for d in devices if d.healthy)
        self.devices.labels(health="Healthy").set(healthy)
        self.devices.labels(health="Unhealthy").set(len(devices) - healthy)
        self.unhealthy_gpus.set(len(inventory.unhealthy))


FakePost = Callable[[dict[str, Any]], dict[str, Any]]
"""A fake fault's handler: the POST's JSON body in, the JSON answer out."""


def _fake_xid(tracker: HealthTracker, body: dict[str, Any]) -> dict[str, Any]:
    """`/fake/xid`: the GPU (`gpu`: index or UUID) reports XID `xid`."""
    uuid = _fake_gpu(tracker, body)
    xid = body.get("xid")
    if type(xid) is not int or xid < 1:
        raise ValueError(f"field xid must be an XID, a whole number above 0, not {_shown(xid)}")
    return {"gpu": uuid, "changed": tracker.on_xid(uuid, xid)}


def _fake_recover(tracker: HealthTracker, body: dict[str, Any]) -> dict[str, Any]:
    """`/fake/recover`: the GPU is healthy again."""
    uuid = _fake_gpu(tracker, body)
    return {"gpu": uuid, "changed": tracker.set_healthy(uuid)}


def _fake_gpu(tracker: HealthTracker, body: object) -> str:
    """The UUID of the GPU a fake fault's body names (`gpu`: its index or UUID)."""
    if not isinstance(body, dict):
        raise ValueError(f'the body must be a JSON object, e.g. {{"gpu": "0"}}, not {_shown(body)}')
    ref = body.get("gpu")
    if type(ref) not in (str, int):
        raise ValueError(f"field gpu must name a GPU by its index or UUID, not {_shown(ref)}")
    try:
        return tracker.resolve(str(ref))
    except KeyError as err:
        raise ValueError(err.args[0]) from None


def _shown(value: object) -> str:
    """A JSON value as a refusal quotes it, cut short."""
    return reprlib.repr(value) if value is not None else "null or missing"


_GETS = ("/metrics", "/healthz", "/readyz")
MAX_POST = 64 * 1024
"""The largest fake fault's JSON body read."""


class _Handler(BaseHTTPRequestHandler):
    server: StatusServer

    @property
    def _path(self) -> str:
        """The path without its query (a scrape's `params`)."""
        return self.path.split("?", 1)[0]

    def do_GET(self) -> None:
        if self._path == "/metrics":
            self._send(200, generate_latest(self.server.metrics.registry), CONTENT_TYPE_LATEST)
        elif self._path == "/healthz":
            self._send(200, b"ok\n", "text/plain")
        elif self._path == "/readyz":
            problem = self.server.not_ready()
            body = f"not ready: {problem}\n" if problem else "ok\n"
            self._send(503 if problem else 200, body.encode(), "text/plain")
        elif self._path in self.server.fake_posts:
            self._not_allowed()
        else:
            self._send(404, f"not found: try {', '.join(_GETS)}\n".encode(), "text/plain")

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_POST(self) -> None:
        handler = self.server.fake_posts.get(self._path)
        if handler is None:
            if self._path in _GETS:
                self._not_allowed()
                return
            why = "fake faults need --fake-gpus"
            if self.server.fake_posts:
                why = f"no fake fault at {self._path}"
            self._send(404, f"{why}\n".encode(), "text/plain")
            return
        try:
            length = int(self.headers.get("Content-Length", "0"))
            if not 0 <= length <= MAX_POST:
                raise ValueError(f"Content-Length {length} is not 0 to {MAX_POST}")
            answer = handler(json.loads(self.rfile.read(length) or "{}"))
        except (ValueError, KeyError, TypeError) as err:
            self._send(400, f"bad request: {err}\n".encode(), "text/plain")
            return
        self._send(200, json.dumps(answer).encode(), "application/json")

    def _not_allowed(self) -> None:
        allowed = "POST" if self._path in self.server.fake_posts else "GET, HEAD"
        self._send(405, f"{self._path} answers {allowed}\n".encode(), "text/plain", allowed)

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed

    def _send(self, status: int, body: bytes, content_type: str, allow: str = "") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if allow:
            self.send_header("Allow", allow)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http: " + format, *args)


class StatusServer(QuietErrors, ThreadingHTTPServer):
    """`/metrics`, `/healthz`, `/readyz` (503 with the reason until `not_ready()` is None),
    and (fake GPUs only) `/fake/xid`, `/fake/recover` and the daemon's own `fake_posts`
    (path -> handler of the JSON body, answering JSON)."""

    daemon_threads = True
    failed_what = "status"

    def __init__(
        self,
        host: str,
        port: int,
        metrics: Metrics,
        fake_health: HealthTracker | None,
        not_ready: Callable[[], str | None] = lambda: None,
        fake_posts: Mapping[str, FakePost] | None = None,
    ) -> None:
        super().__init__((host, port), _Handler)
        self.metrics = metrics
        self.fake_posts: dict[str, FakePost] = dict(fake_posts or {})
        if fake_health is not None:
            self.fake_posts["/fake/xid"] = functools.partial(_fake_xid, fake_health)
            self.fake_posts["/fake/recover"] = functools.partial(_fake_recover, fake_health)
        self.not_ready = not_ready
        self._thread = threading.Thread(target=self.serve_forever, name="metrics-http", daemon=True)

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return int(self.server_address[1])

    def start(self) -> None:
        """Serve in a background thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket (also one never served: `shutdown` would wait for
        a serving loop that never began)."""
        if self._thread.ident is not None:
            self.shutdown()
        self.server_close()

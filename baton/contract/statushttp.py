"""A small HTTP server for a daemon's probes and status: /healthz, /readyz, /metrics, /v1/status."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


class StatusServer:
    """HTTP/1.1, one request per connection; enough for probes, Prometheus and `baton status`."""

    def __init__(
        self,
        registry: CollectorRegistry,
        status: Callable[[], dict[str, Any]],
        ready: Callable[[], bool],
    ) -> None:
        self._registry = registry
        self._status = status
        self._ready = ready
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port (useful with port 0)."""
        self._server = await asyncio.start_server(self._handle, host, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def route(self, method: str, path: str) -> tuple[int, str, bytes]:
        """(status, content type, body) for a request."""
        path = path.split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"only GET\n"
        if path == "/healthz":
            return 200, "text/plain", b"ok\n"
        if path == "/readyz":
            ok = self._ready()
            return (200 if ok else 503), "text/plain", b"ready\n" if ok else b"starting\n"
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self._registry)
        if path == "/v1/status":
            body = json.dumps(self._status(), indent=1).encode()
            return 200, "application/json", body
        return 404, "text/plain", b"not found: try /healthz, /readyz, /metrics, /v1/status\n"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            method, path, *_ = request.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            code, ctype, body = self.route(method, path)
            head = (
                f"HTTP/1.1 {code} {_REASONS.get(code, 'Error')}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + (b"" if method == "HEAD" else body))
            await writer.drain()
        except (TimeoutError, ValueError, asyncio.IncompleteReadError, ConnectionError) as exc:
            log.debug("bad HTTP request: %s", exc)
        finally:
            writer.close()

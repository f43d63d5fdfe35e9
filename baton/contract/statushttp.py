"""A small HTTP server for a daemon's probes and status: /healthz, /readyz, /metrics, /v1/status."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}
HEAD_LIMIT = 64 * 1024
"""The most bytes a request's line and headers may take (asyncio's stream limit)."""
HEAD_TIMEOUT_S = 10.0
"""How long a client has to send its request line and headers."""
WRITE_TIMEOUT_S = 10.0
"""How long a client has to take in the answer; one that stops reading is cut off (its
connection aborted), so it holds neither the answer's bytes nor the connection for ever."""


class StatusServer:
    """HTTP/1.1, one request per connection; enough for probes, Prometheus and `baton status`.

    `/readyz` answers 200 while `not_ready()` is None, else 503 with the one line it returns.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        status: Callable[[], dict[str, Any]],
        not_ready: Callable[[], str | None],
    ) -> None:
        self._registry = registry
        self._status = status
        self._not_ready = not_ready
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port (useful with port 0)."""
        self._server = await asyncio.start_server(self._handle, host, port, limit=HEAD_LIMIT)
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
            return 405, "text/plain", b"only GET and HEAD\n"
        if path == "/healthz":
            return 200, "text/plain", b"ok\n"
        if path == "/readyz":
            problem = self._not_ready()
            if problem is None:
                return 200, "text/plain", b"ready\n"
            return 503, "text/plain", f"not ready: {problem}\n".encode()
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self._registry)
        if path == "/v1/status":
            body = json.dumps(self._status(), indent=1).encode()
            return 200, "application/json", body
        return 404, "text/plain", b"not found: try /healthz, /readyz, /metrics, /v1/status\n"

    def answer(self, head: bytes) -> tuple[str, int, str, bytes]:
        """(method, status, content type, body) for a request's line and headers; a request
        line that is not `METHOD /path HTTP/1.x` is a 400 saying so."""
        words = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
        method, path, version = [*words, "", ""][:3] if len(words) <= 3 else ("", "", "")
        if not (method.isalpha() and path.startswith("/") and version.startswith("HTTP/1.")):
            return "", 400, "text/plain", b"bad request line: expected METHOD /path HTTP/1.1\n"
        return method, *self.route(method, path)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
            except asyncio.LimitOverrunError:
                method, code, ctype = "", 431, "text/plain"
                body = f"request line and headers over {HEAD_LIMIT} bytes; not read\n".encode()
            else:
                method, code, ctype, body = self.answer(head)
            allow = "Allow: GET, HEAD\r\n" if code == 405 else ""
            start = (
                f"HTTP/1.1 {code} {_REASONS.get(code, 'Error')}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\n{allow}Connection: close\r\n\r\n"
            )
            writer.write(start.encode() + (b"" if method == "HEAD" else body))
            try:
                await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_S)
            except TimeoutError:  # close() would keep the unsent bytes until the client reads
                log.info("a status client read no answer within %g s: cut off", WRITE_TIMEOUT_S)
                writer.transport.abort()
                return
            if code == 431:  # closed on unread bytes, the socket would reset the answer away:
                writer.write_eof()  # the answer is whole; read on until the client is done
                await asyncio.wait_for(_discard(reader, 16 * HEAD_LIMIT), HEAD_TIMEOUT_S)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError) as exc:
            log.debug("bad HTTP request: %s", exc)
        except asyncio.CancelledError:  # the loop is ending: asyncio would log it as an error
            log.debug("HTTP request cut short: the server is stopping")
        finally:
            writer.close()


async def _discard(reader: asyncio.StreamReader, most: int) -> None:
    """Read and drop what the client still sends, until it stops or `most` bytes."""
    while most > 0 and (chunk := await reader.read(min(most, HEAD_LIMIT))):
        most -= len(chunk)

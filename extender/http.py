"""A small HTTP/1.1 server on asyncio for the extender: keep-alive, TLS, bounded bodies,
answers in request order, a graceful stop.

kube-scheduler waits for filter and prioritize inside its one-pod-at-a-time scheduling cycle,
so the verbs' HTTP path is paid once per pod. A route answered on the loop is called from the
protocol's own callback with the parsed request: no task, framework or middleware between
them. A route whose handler returns a coroutine (bind, which waits on the API server) answers
when it finishes, and a route with a thread pool runs there; requests behind either on the
same connection wait for its answer, so answers leave in request order.
Requests are parsed by httptools (llhttp, the parser of Node.js and uvicorn).

This module is the server: its routing and its stop. One connection (parsing, answering in
order, timeouts) is `extender.http_connection`; the request, answer and route types and an
answer's bytes are `extender.http_messages`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from dataclasses import replace

from extender.http_connection import Connection
from extender.http_messages import JSON, TEXT, Reply, Request, Route, Routes, text

__all__ = [
    "IDLE_TIMEOUT_S",
    "JSON",
    "MAX_BODY",
    "MAX_HEAD",
    "REQUEST_TIMEOUT_S",
    "TEXT",
    "Connection",
    "HttpServer",
    "Reply",
    "Request",
    "Route",
    "Routes",
    "text",
]

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024 * 1024
"""The largest request body read: ExtenderArgs with a full NodeList of thousands of nodes fits."""
MAX_HEAD = 1024 * 1024
"""The most bytes a request's line and headers may take (Go's `http.DefaultMaxHeaderBytes`):
kube-scheduler's are a few hundred. The parser would hold a longer one whole, without bound."""
IDLE_TIMEOUT_S = 120.0
"""How long a kept-alive connection may wait for its next request: longer than Go's 90 s
idle-connection timeout, so kube-scheduler closes idle connections, not we under its request."""
REQUEST_TIMEOUT_S = 30.0
"""How long a begun request may take to arrive whole."""
CLIENT_CERT_NEEDED = (
    "needs a client certificate signed by the extender's --tls-client-ca "
    "(kube-scheduler's tlsConfig certFile and keyFile); this connection presented none"
)


class HttpServer:
    """Serves `routes` on a listening socket until stopped."""

    def __init__(
        self,
        routes: Routes,
        ssl_context: ssl.SSLContext | None = None,
        max_body: int = MAX_BODY,
        max_head: int = MAX_HEAD,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ):
        self.routes = routes
        self.ssl_context = ssl_context
        self.max_body = max_body
        self.max_head = max_head
        self.idle_timeout_s = idle_timeout_s
        self.request_timeout_s = request_timeout_s
        self.connections: set[Connection] = set()
        self._allowed: dict[str, list[str]] = {}
        for method, path in routes:
            self._allowed.setdefault(path, []).append(method)
        self._gone: asyncio.Event | None = None

    @property
    def verifies_clients(self) -> bool:
        """Whether clients may present a certificate that the server verifies."""
        context = self.ssl_context
        return context is not None and context.verify_mode != ssl.CERT_NONE

    def route(
        self, request: Request, client_cert: bool = False
    ) -> tuple[Route | None, Reply | None]:
        """The request's route, or the refusal when there is none or when it needs a client
        certificate that the client (`client_cert`: it presented a verified one) lacks."""
        route = self.routes.get((request.method, request.path))
        if route is not None:
            if route.client_cert and self.verifies_clients and not client_cert:
                return None, text(403, f"{request.path} {CLIENT_CERT_NEEDED}")
            return route, None
        allowed = self._allowed.get(request.path)
        if allowed is None:
            refusal = text(404, f"no such path: {request.path}")
        else:
            methods = ", ".join(sorted(allowed))
            message = f"{request.method} is not served on {request.path}; use {methods}"
            refusal = Reply(405, (message + "\n").encode(), TEXT, (("Allow", methods),))
        if request.method == "HEAD":  # no body: the client would read it as the next answer
            refusal = replace(refusal, body=b"")
        return None, refusal

    def connection_gone(self) -> None:
        if self._gone is not None and not self.connections:
            self._gone.set()

    async def serve(self, sock: socket.socket, stop: asyncio.Event, grace_s: float | None) -> None:
        """Accept on `sock` until `stop` is set; then let open requests finish for up to
        `grace_s` seconds (None: as long as they take) and close every connection."""
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: Connection(self), sock=sock, ssl=self.ssl_context, backlog=1024
        )
        try:
            await stop.wait()
        finally:
            server.close()
            self._gone = asyncio.Event()
            for connection in list(self.connections):
                connection.finish()
            if self.connections:
                try:
                    await asyncio.wait_for(self._gone.wait(), grace_s)
                except TimeoutError:
                    log.warning(
                        "%d connections still busy after %g s; closing them",
                        len(self.connections),
                        grace_s,
                    )
            for connection in list(self.connections):
                connection.abort()
            await server.wait_closed()

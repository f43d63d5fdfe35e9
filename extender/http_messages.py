"""What the extender's HTTP server reads and writes: a parsed `Request`, a `Reply` and its
bytes on the wire, and a `Route`, whose handler is called here (a handler's exception is a 500
naming the request, logged under `extender.http`)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from http import HTTPStatus

log = logging.getLogger("extender.http")

JSON = "application/json"
TEXT = "text/plain; charset=utf-8"


@dataclass(frozen=True, slots=True)
class Request:
    """One parsed request."""

    method: str
    path: str
    body: bytes


@dataclass(frozen=True, slots=True)
class Reply:
    """One answer."""

    status: int
    body: bytes
    content_type: str = JSON
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Route:
    """A handler, called on the event loop unless it has a thread pool to run on. A handler on
    the loop answers at once (a `Reply`) or when its coroutine finishes (it must not block)."""

    handler: Callable[[Request], Reply | Awaitable[Reply]]
    pool: Executor | None = None
    client_cert: bool = False
    """Answered only to a client that presented a certificate the server verified, when the
    server verifies clients (`extender.tlsfiles.tls_context`); others get 403."""


Routes = dict[tuple[str, str], Route]
"""(method, path) -> route."""


def text(status: int, message: str) -> Reply:
    """A plain-text answer of one line."""
    return Reply(status, (message + "\n").encode(), TEXT)


def call(route: Route, request: Request) -> Reply | Awaitable[Reply]:
    try:
        return route.handler(request)
    except Exception as err:
        return _failed(request, err)


def call_blocking(route: Route, request: Request) -> Reply:
    reply = call(route, request)
    assert isinstance(reply, Reply), f"{request.path}: a route with a pool answers a Reply"
    return reply


async def awaited(request: Request, reply: Awaitable[Reply]) -> Reply:
    try:
        return await reply
    except Exception as err:
        return _failed(request, err)


def _failed(request: Request, err: Exception) -> Reply:
    log.exception("%s %s failed", request.method, request.path)
    return text(500, f"{request.method} {request.path} failed inside the extender: {err}")


_REASONS = {status.value: status.phrase for status in HTTPStatus}


def encode(reply: Reply, keep_alive: bool) -> bytes:
    reason = _REASONS.get(reply.status, "")
    head = [
        f"HTTP/1.1 {reply.status} {reason}",
        f"Content-Type: {reply.content_type}",
        f"Content-Length: {len(reply.body)}",
    ]
    head += [f"{name}: {value}" for name, value in reply.headers]
    if not keep_alive:
        head.append("Connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + reply.body

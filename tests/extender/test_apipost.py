"""ApiPost against a stand-in API server on the test's own event loop: the request as sent,
the answer as read (sized or chunked), errors by status, kept-alive connections and their
reuse, and an API server that is slow, gone or closed the connection."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import kubernetes.client
import pytest

from extender import kubeproto
from extender.apipost import ApiPost
from extender.errors import ApiConflict, ApiFailure, ApiUnsure

WAIT_S = 5.0
"""The bound on every test body: no wait in it outlives this."""
BINDING = "/api/v1/namespaces/team/pods/p1/binding"
WHAT = "bind team/p1"
BODY = b'{"kind":"Binding","target":{"kind":"Node","name":"node-a"}}'


def answer(status: str, body: bytes, *headers: str) -> bytes:
    """An HTTP/1.1 answer with a Content-Length."""
    head = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


@dataclass(frozen=True)
class Seen:
    """One request as the stand-in server read it."""

    connection: int
    request_line: str
    headers: dict[str, str]
    body: bytes


class StandIn:
    """An API server that records each request and gives the next of `answers` (None: no
    answer at all, until the test ends); with `close_after` it closes the connection after
    each answer without saying so, as an API server dropping an idle connection does."""

    def __init__(self, *answers: bytes | None, close_after: bool = False):
        self.answers = list(answers)
        self.close_after = close_after
        self.seen: list[Seen] = []
        self.connections = 0
        self.closed = asyncio.Event()
        """Set when the server has closed a connection."""
        self._release = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> StandIn:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._release.set()
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=WAIT_S)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        number = self.connections
        try:
            while await self._exchange(number, reader, writer):
                pass
        finally:
            writer.close()
            await writer.wait_closed()
            self.closed.set()

    async def _exchange(
        self, number: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """One request read and answered; whether to wait for another on the connection."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False  # the client closed it
        request_line, *lines = head.decode("latin-1").rstrip("\r\n").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        self.seen.append(Seen(number, request_line, headers, body))
        reply = self.answers.pop(0)
        if reply is None:
            await self._release.wait()
            return False
        writer.write(reply)
        await writer.drain()
        return not self.close_after


def run(body: Coroutine[Any, Any, None]) -> None:
    """Runs a test body on a fresh event loop, bounded."""

    async def bounded() -> None:
        async with asyncio.timeout(2 * WAIT_S):
            await body

    asyncio.run(bounded())


@asynccontextmanager
async def poster(
    port: int, timeout_s: float = WAIT_S, token: str | None = None, prefix: str = ""
) -> AsyncIterator[ApiPost]:
    """An ApiPost on a real API client for 127.0.0.1:`port`; its connections closed after."""
    configuration = kubernetes.client.Configuration(host=f"http://127.0.0.1:{port}{prefix}")
    if token is not None:
        configuration.api_key = {"authorization": token}
    api_client = kubernetes.client.ApiClient(configuration)
    post = ApiPost(api_client, timeout_s)
    try:
        yield post
    finally:
        post.close()
        api_client.close()


def test_a_201_gives_its_body_and_the_request_is_as_sent() -> None:
    """The request line, Host, Content-Type, Content-Length and body are as sent; no token,
    no Authorization; the answer's body is returned."""

    async def body() -> None:
        reply = answer("201 Created", b'{"kind":"Status","status":"Success"}')
        async with StandIn(reply) as server, poster(server.port) as post:
            assert await post(BINDING, BODY, WHAT) == b'{"kind":"Status","status":"Success"}'
        (seen,) = server.seen
        assert seen.request_line == f"POST {BINDING} HTTP/1.1"
        assert seen.headers["host"] == f"127.0.0.1:{server.port}"
        assert seen.headers["content-type"] == "application/json"
        assert seen.headers["accept"] == "application/json"
        assert seen.headers["content-length"] == str(len(BODY))
        assert "authorization" not in seen.headers
        assert seen.body == BODY

    run(body())


def test_a_protobuf_body_goes_with_its_content_type_and_the_answer_is_asked_in_json() -> None:
    async def body() -> None:
        raw = kubeproto.binding("ns", "p", "node-1")
        async with StandIn(answer("201 Created", b"{}")) as server, poster(server.port) as post:
            await post(BINDING, raw, WHAT, kubeproto.CONTENT_TYPE)
        (seen,) = server.seen
        assert seen.headers["content-type"] == "application/vnd.kubernetes.protobuf"
        assert seen.headers["accept"] == "application/json"
        assert seen.body == raw

    run(body())


def test_a_chunked_answer_is_reassembled_and_the_connection_stays_in_step() -> None:
    """Chunks (with an extension and a trailer) are joined; the next post on the same
    connection reads its own answer."""

    async def body() -> None:
        chunked = (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n"
        )
        async with (
            StandIn(chunked, answer("201 Created", b"next")) as server,
            poster(server.port) as post,
        ):
            assert await post(BINDING, BODY, WHAT) == b"hello world"
            assert await post(BINDING, BODY, WHAT) == b"next"
        assert server.connections == 1

    run(body())


def test_a_409_is_an_api_conflict_with_the_status_message() -> None:
    """A 409's Kubernetes Status message is in the ApiConflict, with what was being done."""

    async def body() -> None:
        status = b'{"kind":"Status","message":"the object has been modified"}'
        async with StandIn(answer("409 Conflict", status)) as server, poster(server.port) as post:
            with pytest.raises(ApiConflict) as caught:
                await post(BINDING, BODY, WHAT)
        message = str(caught.value)
        assert "API server answered 409: the object has been modified" in message
        assert message.startswith(WHAT)

    run(body())


def test_a_503_is_an_api_failure_not_a_conflict() -> None:
    """Any other refusal is an ApiFailure naming the status (and the reason, lacking a
    Status body)."""

    async def body() -> None:
        reply = answer("503 Service Unavailable", b"overloaded\n")
        async with StandIn(reply) as server, poster(server.port) as post:
            with pytest.raises(ApiFailure) as caught:
                await post(BINDING, BODY, WHAT)
        assert not isinstance(caught.value, ApiConflict)
        assert str(caught.value) == f"{WHAT}: API server answered 503: Service Unavailable"

    run(body())


def test_consecutive_posts_reuse_one_connection() -> None:
    """Two posts go over one kept-alive connection."""

    async def body() -> None:
        async with (
            StandIn(answer("201 Created", b"1"), answer("201 Created", b"2")) as server,
            poster(server.port) as post,
        ):
            assert await post(BINDING, BODY, WHAT) == b"1"
            assert await post(BINDING, BODY, WHAT) == b"2"
        assert server.connections == 1
        assert [seen.connection for seen in server.seen] == [1, 1]

    run(body())


def test_an_answer_saying_connection_close_is_not_reused() -> None:
    """After `Connection: close` the next post opens a new connection."""

    async def body() -> None:
        first = answer("201 Created", b"1", "Connection: close")
        async with (
            StandIn(first, answer("201 Created", b"2")) as server,
            poster(server.port) as post,
        ):
            assert await post(BINDING, BODY, WHAT) == b"1"
            assert await post(BINDING, BODY, WHAT) == b"2"
        assert [seen.connection for seen in server.seen] == [1, 2]

    run(body())


def test_a_connection_the_server_closed_while_idle_is_retried_on_a_new_one() -> None:
    """The server drops the kept-alive connection between two posts: the second post is sent
    again on a new connection and succeeds."""

    async def body() -> None:
        answers = (answer("201 Created", b"1"), answer("201 Created", b"2"))
        async with StandIn(*answers, close_after=True) as server, poster(server.port) as post:
            assert await post(BINDING, BODY, WHAT) == b"1"
            await server.closed.wait()
            assert await post(BINDING, BODY, WHAT) == b"2"
        assert server.connections == 2
        assert [seen.connection for seen in server.seen] == [1, 2]

    run(body())


def test_no_answer_within_timeout_is_unreachable() -> None:
    """A server that reads the request and says nothing for `timeout_s` is unreachable, and
    since the request went out, it may have been carried out (`ApiUnsure`)."""

    async def body() -> None:
        async with StandIn(None) as server, poster(server.port, timeout_s=0.3) as post:
            with pytest.raises(ApiUnsure) as caught:
                await post(BINDING, BODY, WHAT)
        assert str(caught.value) == (
            f"{WHAT}: API server unreachable: TimeoutError: no answer in time"
            " (after the request was sent: it may have taken effect)"
        )
        assert len(server.seen) == 1

    run(body())


def test_nothing_listening_is_unreachable() -> None:
    """A refused connection is an ApiFailure saying the API server is unreachable."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as bound:
        bound.bind(("127.0.0.1", 0))  # held, not listening: connections to it are refused
        port = int(bound.getsockname()[1])

        async def body() -> None:
            async with poster(port) as post:
                with pytest.raises(ApiFailure) as caught:
                    await post(BINDING, BODY, WHAT)
            assert not isinstance(caught.value, ApiConflict | ApiUnsure)  # nothing was sent
            message = str(caught.value)
            assert message.startswith(f"{WHAT}: API server unreachable: ConnectionRefusedError")

        run(body())


def test_the_bearer_token_and_the_host_path_prefix_are_sent() -> None:
    """The API client's token arrives as `authorization`; a path in its host prefixes the
    request's."""

    async def body() -> None:
        async with (
            StandIn(answer("201 Created", b"{}")) as server,
            poster(server.port, token="Bearer abc", prefix="/k8s/") as post,
        ):
            assert await post(BINDING, BODY, WHAT) == b"{}"
        (seen,) = server.seen
        assert seen.headers["authorization"] == "Bearer abc"
        assert seen.request_line == f"POST /k8s{BINDING} HTTP/1.1"

    run(body())

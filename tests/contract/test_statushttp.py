"""The agent's and the coordinator's status server as an odd client meets it: each request gets
an HTTP answer that says what is wrong, and the daemon's log holds no traceback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading

import pytest
from prometheus_client import CollectorRegistry

from baton.contract import statushttp
from baton.contract.statushttp import HEAD_LIMIT, StatusServer


async def _ask(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


def _answers(*requests: bytes, not_ready: str | None = None) -> list[bytes]:
    async def run() -> list[bytes]:
        server = StatusServer(CollectorRegistry(), lambda: {"gpus": {}}, lambda: not_ready)
        port = await server.start("127.0.0.1", 0)
        try:
            return [await _ask(port, request) for request in requests]
        finally:
            await server.stop()

    return asyncio.run(run())


@pytest.mark.parametrize(
    ("request_head", "status", "said"),
    [
        (b"GET\r\n\r\n", b"400 Bad Request", b"bad request line: expected METHOD /path HTTP/1.1"),
        (b"\r\n\r\n", b"400 Bad Request", b"bad request line"),
        (b"GET /v1/status HTTP/1.1 extra\r\n\r\n", b"400 Bad Request", b"bad request line"),
        (b"GET nowhere HTTP/1.1\r\n\r\n", b"400 Bad Request", b"bad request line"),
        (
            b"GET /v1/status HTTP/1.1\r\nX-Big: " + b"a" * (2 * HEAD_LIMIT) + b"\r\n\r\n",
            b"431 Request Header Fields Too Large",
            b"request line and headers over 65536 bytes; not read",
        ),
        (
            b"GET /" + b"a" * (2 * HEAD_LIMIT) + b" HTTP/1.1\r\n\r\n",
            b"431 Request Header Fields Too Large",
            b"over 65536 bytes",
        ),
        (b"DELETE /metrics HTTP/1.1\r\n\r\n", b"405 Method Not Allowed", b"only GET and HEAD"),
        (b"GET /v1/status?verbose=1 HTTP/1.1\r\n\r\n", b"200 OK", b'"gpus"'),
    ],
)
def test_an_odd_request_gets_a_clear_answer_and_no_traceback(
    request_head: bytes, status: bytes, said: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    [answer] = _answers(request_head)
    assert answer.startswith(b"HTTP/1.1 " + status + b"\r\n"), answer[:200]
    assert said in answer.partition(b"\r\n\r\n")[2], answer[:200]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_method_it_does_not_serve_is_answered_with_those_it_does() -> None:
    [post, head] = _answers(
        b"POST /v1/status HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"HEAD /healthz HTTP/1.1\r\n\r\n"
    )
    headers, _, body = post.partition(b"\r\n\r\n")
    assert headers.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n")
    assert b"\r\nAllow: GET, HEAD" in headers and body == b"only GET and HEAD\n"
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")


def test_readyz_answers_the_reason_it_is_not_ready_in_one_line() -> None:
    request = b"GET /readyz HTTP/1.1\r\n\r\n"
    [ready] = _answers(request)
    assert ready.startswith(b"HTTP/1.1 200 OK\r\n") and ready.endswith(b"\r\n\r\nready\n")
    [waiting, healthy] = _answers(request, b"GET /healthz HTTP/1.1\r\n\r\n", not_ready="why")
    assert waiting.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert waiting.endswith(b"\r\n\r\nnot ready: why\n")
    assert healthy.startswith(b"HTTP/1.1 200 OK\r\n")


def test_a_client_that_stops_reading_is_cut_off_within_the_write_timeout(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A scraper or `curl` that stops reading mid-answer (stopped, stuck) must not hold the
    connection and the unsent part of a large answer in the daemon for ever."""
    monkeypatch.setattr(statushttp, "WRITE_TIMEOUT_S", 0.2, raising=False)
    body = {"gpus": "x" * (16 << 20)}  # far beyond what the sockets' buffers take in
    cut_off = threading.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "cut off" in record.getMessage():
                cut_off.set()

    seen = Seen()
    statushttp.log.addHandler(seen)
    caplog.set_level(logging.INFO, logger=statushttp.log.name)

    async def run() -> int:
        server = StatusServer(CollectorRegistry(), lambda: body, lambda: None)
        port = await server.start("127.0.0.1", 0)
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            client.connect(("127.0.0.1", port))
            client.sendall(b"GET /v1/status HTTP/1.1\r\n\r\n")  # and reads nothing yet
            assert await asyncio.to_thread(cut_off.wait, 10), "still writing to a stuck client"
            client.settimeout(10)
            got = 0
            with contextlib.suppress(ConnectionResetError):
                while chunk := await asyncio.to_thread(client.recv, 1 << 20):
                    got += len(chunk)
            return got
        finally:
            client.close()
            await server.stop()

    try:
        got = asyncio.run(run())
    finally:
        statushttp.log.removeHandler(seen)
    assert got < len(json.dumps(body, indent=1)), "the whole answer came: it was never cut off"

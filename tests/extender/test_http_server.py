"""The extender's HTTP/1.1 server on the wire: keep-alive, answers in request order, bounded
bodies, refusals, timeouts and a graceful stop, spoken to over plain sockets."""

from __future__ import annotations

import threading

import pytest

from extender.http import Routes
from extender.server import ServerThread
from tests.extender.http_wire import GET_FAST, GET_SLOW, WAIT_S, Connect, Gate, refused


def test_two_requests_on_one_kept_alive_connection(connect: Connect) -> None:
    """HTTP/1.1 keeps the connection: the second request on it is answered too."""
    wire = connect()
    wire.send(GET_FAST)
    first = wire.answer()
    assert first.head == (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 5\r\n\r\n"
    )
    assert first.body == b"fast\n"
    wire.send(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
    second = wire.answer()
    assert (second.status, second.body) == (200, b"hello")
    assert "connection" not in second.headers


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /fast HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"GET /fast HTTP/1.0\r\n\r\n",
    ],
    ids=["connection-close", "http-1.0"],
)
def test_a_request_that_does_not_keep_alive_is_answered_then_closed(
    connect: Connect, request_bytes: bytes
) -> None:
    """`Connection: close` and HTTP/1.0 get their answer with `Connection: close`, then EOF."""
    wire = connect()
    wire.send(request_bytes)
    answer = wire.answer()
    assert (answer.status, answer.body) == (200, b"fast\n")
    assert answer.headers["connection"] == "close"
    assert wire.closed()


def test_pipelined_answers_leave_in_request_order(connect: Connect, gate: Gate) -> None:
    """A fast request behind a slow coroutine on one connection is answered after it."""
    wire = connect()
    wire.send(GET_SLOW + GET_FAST)
    assert gate.started.wait(WAIT_S)
    assert wire.silent_for(0.2), "an answer left while the first request was still running"
    assert gate.events == ["slow-start"]
    gate.release.set()
    first, second = wire.answer(), wire.answer()
    assert (first.status, first.body) == (200, b"slow\n")
    assert (second.status, second.body) == (200, b"fast\n")
    assert gate.events == ["slow-start", "slow-done", "fast"]


def test_a_route_with_a_thread_pool_is_answered_from_it(connect: Connect) -> None:
    """The pooled handler runs on its pool; the request pipelined behind it still follows."""
    wire = connect()
    wire.send(b"GET /pooled HTTP/1.1\r\nHost: x\r\n\r\n" + GET_FAST)
    pooled, fast = wire.answer(), wire.answer()
    assert pooled.status == 200
    assert pooled.body.startswith(b"test-pool")
    assert fast.body == b"fast\n"


def test_expect_100_continue_is_answered_before_the_body_is_sent(connect: Connect) -> None:
    """`Expect: 100-continue` gets an interim 100 Continue, then the final answer."""
    wire = connect()
    wire.send(
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
    )
    assert wire.head() == b"HTTP/1.1 100 Continue\r\n\r\n"
    wire.send(b"hello")
    answer = wire.answer()
    assert (answer.status, answer.body) == (200, b"hello")


def test_unknown_path_is_404_and_wrong_method_is_405_with_allow(connect: Connect) -> None:
    """404 names the path; 405 lists the methods served there, in `Allow` and the body."""
    wire = connect()
    wire.send(b"GET /nope?x=1 HTTP/1.1\r\nHost: x\r\n\r\n")
    missing = wire.answer()
    assert missing.status == 404
    assert missing.body == b"no such path: /nope\n"
    wire.send(b"DELETE /echo HTTP/1.1\r\nHost: x\r\n\r\n")
    wrong = wire.answer()
    assert wrong.status == 405
    assert wrong.headers["allow"] == "POST, PUT"
    assert b"DELETE is not served on /echo" in wrong.body
    wire.send(GET_FAST)
    assert wire.answer().status == 200


def test_an_answer_to_head_has_no_body_and_the_connection_goes_on(connect: Connect) -> None:
    """A client reads only the head of an answer to HEAD: a body sent after it would be read
    as the start of the next answer on the connection."""
    wire = connect()
    for path, status in ((b"/fast", b" 405 "), (b"/nope", b" 404 ")):
        wire.send(b"HEAD " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status in wire.head().split(b"\r\n")[0]  # as a client reads it: no body
        wire.send(GET_FAST)
        after = wire.answer()
        assert (after.status, after.body) == (200, b"fast\n")


@pytest.mark.parametrize(
    ("limits", "request_bytes", "says"),
    [
        ({"max_body": 16}, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 17\r\n\r\n", 413),
        (
            {"max_body": 16},
            b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"a\r\n0123456789\r\na\r\n0123456789\r\n0\r\n\r\n",
            413,
        ),
        ({"max_head": 1024}, b"GET /fast?q=" + b"a" * 4096, 431),
        ({"max_head": 1024}, b"GET /fast HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 4096, 431),
    ],
    ids=["body-content-length", "body-chunked", "head-url", "head-header"],
)
def test_a_request_over_a_limit_is_refused_unread_and_closed(
    connect: Connect, limits: dict[str, int], request_bytes: bytes, says: int
) -> None:
    """A body over `max_body` (declared or streamed), or a request line and headers past
    `max_head` (the parser gathers them whole), is refused unread and closed; others served."""
    wire = connect(**limits)
    wire.send(request_bytes)
    answer = wire.answer()
    what = "request body" if "max_body" in limits else "request line and headers"
    [limit] = limits.values()
    assert (answer.status, answer.body) == (says, f"{what} over {limit} bytes; not read\n".encode())
    assert answer.headers["connection"] == "close"
    assert wire.closed()
    other = connect(wire.sock.getpeername()[1])
    other.send(GET_FAST)
    assert other.answer().body == b"fast\n"


def test_a_chunked_body_is_reassembled_for_the_handler(connect: Connect) -> None:
    """The handler gets the chunks joined; the connection stays open for the next request."""
    wire = connect()
    wire.send(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
    wire.send(b"6;ext=1\r\n world\r\n0\r\n\r\n")
    answer = wire.answer()
    assert (answer.status, answer.body) == (200, b"hello world")
    wire.send(GET_FAST)
    assert wire.answer().body == b"fast\n"


def test_a_malformed_request_line_is_400_and_closed(connect: Connect) -> None:
    """A request that cannot be parsed is answered 400 and the connection closed."""
    wire = connect()
    wire.send(b"NOT AN HTTP REQUEST\r\n\r\n")
    answer = wire.answer()
    assert answer.status == 400
    assert answer.body.startswith(b"bad HTTP request")
    assert answer.headers["connection"] == "close"
    assert wire.closed()


@pytest.mark.parametrize("path", ["/boom", "/boom-later"])
def test_a_failing_handler_is_500_and_the_server_keeps_serving(connect: Connect, path: str) -> None:
    """A handler's exception (raised at once or from its coroutine) is a 500 naming the path;
    the same connection is answered next."""
    wire = connect()
    wire.send(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    failed = wire.answer()
    assert failed.status == 500
    assert f"GET {path} failed inside the extender: kaboom".encode() in failed.body
    assert "connection" not in failed.headers
    wire.send(GET_FAST)
    assert wire.answer().body == b"fast\n"


def test_a_half_sent_request_is_408_and_closed(connect: Connect) -> None:
    """A request not received whole within `request_timeout_s` is answered 408, then closed."""
    wire = connect(request_timeout_s=0.3)
    wire.send(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
    answer = wire.answer()
    assert answer.status == 408
    assert answer.body == b"request not received whole within 0.3 s\n"
    assert answer.headers["connection"] == "close"
    assert wire.closed()


def test_an_idle_kept_alive_connection_is_closed_by_the_server(connect: Connect) -> None:
    """After its answer, a connection with no next request within `idle_timeout_s` is closed."""
    wire = connect(idle_timeout_s=0.3)
    wire.send(GET_FAST)
    answer = wire.answer()
    assert "connection" not in answer.headers
    assert wire.closed()


def test_stop_lets_the_request_in_flight_finish_and_refuses_new_connections(
    routes: Routes, connect: Connect, gate: Gate
) -> None:
    """Stopping closes idle connections and the listener at once; the request in flight is
    still answered (with `Connection: close`) before the server goes."""
    server = ServerThread(routes).start()
    stopper = threading.Thread(target=server.stop, name="test-stopper")
    try:
        busy, idle = connect(server.port), connect(server.port)
        idle.send(GET_FAST)
        assert idle.answer().status == 200
        busy.send(GET_SLOW)
        assert gate.started.wait(WAIT_S)
        stopper.start()
        assert idle.closed(), "the idle connection outlived the stop"
        assert refused(server.port)
        gate.release.set()
        answer = busy.answer()
        assert (answer.status, answer.body) == (200, b"slow\n")
        assert answer.headers["connection"] == "close"
        assert busy.closed()
    finally:
        gate.release.set()
        if stopper.ident is None:
            server.stop()
        stopper.join(WAIT_S)
    assert not stopper.is_alive()
    assert refused(server.port)


def test_stopping_a_stopped_server_thread_is_harmless(routes: Routes) -> None:
    """`stop()` inside the `with` block, then the block's own stop on exit, raise nothing."""
    with ServerThread(routes) as server:
        server.stop()

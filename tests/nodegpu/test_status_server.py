"""The node layer's status server (`/metrics`, `/healthz`, `/readyz`) as a scraper meets it."""

from __future__ import annotations

import http.client
import logging
import socket
import struct
import threading

import pytest

from nodegpu.health import DEFAULT_IGNORED_XIDS, HealthTracker
from nodegpu.inventory import Inventory, NodeGpu
from nodegpu.metrics import Metrics, StatusServer
from nodegpu.state import LiveInventory


class Seen(logging.Handler):
    """Keeps the records it is given; `arrived` once one says how the request ended (the
    access line comes first, when the answer starts)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.arrived = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        if record.levelno > logging.DEBUG or "went away" in record.getMessage():
            self.arrived.set()


def test_a_client_gone_mid_request_is_one_debug_line_not_a_traceback_on_stderr(
    capfd: pytest.CaptureFixture[str],
) -> None:
    logger = logging.getLogger("baton.contract.quiet")
    seen, level = Seen(), logger.level
    logger.addHandler(seen)
    logger.setLevel(logging.DEBUG)
    server = StatusServer("127.0.0.1", 0, Metrics(), None)
    server.start()
    try:
        client = socket.create_connection(("127.0.0.1", server.port))
        client.sendall(b"GET /metrics HTTP/1.1\r\nHost: node\r\n")  # headers not ended
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # a reset mid-request: as a scrape that timed out
        assert seen.arrived.wait(10), "the server said nothing of the reset"
    finally:
        server.stop()
        logger.removeHandler(seen)
        logger.setLevel(level)
    said = [r.getMessage() for r in seen.records if "went away" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("status client 127.0.0.1:"), said
    assert said[0].endswith("went away mid-request (ConnectionResetError)"), said
    assert all(r.levelno == logging.DEBUG for r in seen.records)
    assert capfd.readouterr().err == ""


def test_a_scrape_with_a_query_head_and_other_methods_get_what_they_ask_or_a_4xx() -> None:
    server = StatusServer("127.0.0.1", 0, Metrics(), None)
    server.start()

    def ask(method: str, path: str) -> tuple[int, str, str]:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        try:
            conn.request(method, path, body=b"" if method in ("POST", "PUT") else None)
            answer = conn.getresponse()
            return answer.status, answer.getheader("Allow") or "", answer.read().decode()
        finally:
            conn.close()

    try:
        status, _, body = ask("GET", "/metrics?format=prometheus")  # a scrape config's params
        assert status == 200 and "baton_deviceplugin_allocations_total" in body
        assert ask("HEAD", "/healthz") == (200, "", "")
        assert ask("GET", "/readyz?verbose") == (200, "", "ok\n")
        for method in ("POST", "PUT", "DELETE"):
            assert ask(method, "/metrics") == (405, "GET, HEAD", "/metrics answers GET, HEAD\n")
        assert ask("GET", "/nowhere") == (404, "", "not found: try /metrics, /healthz, /readyz\n")
    finally:
        server.stop()


def test_a_fake_fault_post_with_a_length_it_cannot_read_is_refused_not_waited_on() -> None:
    server = StatusServer("127.0.0.1", 0, Metrics(), None, fake_posts={"/fake/x": dict})
    server.start()
    try:
        for length in ("-1", str(1 << 40)):
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as client:
                client.sendall(
                    f"POST /fake/x HTTP/1.1\r\nContent-Length: {length}\r\n\r\n".encode()
                )
                answer = client.makefile("rb").read().decode()
            assert answer.startswith("HTTP/1.0 400 "), answer
            assert f"bad request: Content-Length {length} is not 0 to 65536\n" in answer
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("GET", "/fake/x")
        assert conn.getresponse().read() == b"/fake/x answers POST\n"
        conn.close()
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("path", "body", "says"),
    [
        (
            "/fake/xid",
            b'{"gpu": "0", "xid": 1e400}',
            "field xid must be an XID, a whole number above 0, not inf",
        ),
        (
            "/fake/xid",
            b'{"gpu": "0", "xid": -5}',
            "field xid must be an XID, a whole number above 0, not -5",
        ),
        (
            "/fake/xid",
            b'{"gpu": "0", "xid": true}',
            "field xid must be an XID, a whole number above 0, not True",
        ),
        (
            "/fake/xid",
            b'{"gpu": "0"}',
            "field xid must be an XID, a whole number above 0, not null or missing",
        ),
        (
            "/fake/xid",
            b'{"gpu": true, "xid": 79}',
            "field gpu must name a GPU by its index or UUID, not True",
        ),
        ("/fake/recover", b"[]", 'the body must be a JSON object, e.g. {"gpu": "0"}, not []'),
        ("/fake/recover", b'{"gpu": "9"}', "no GPU '9' on this node"),
    ],
)
def test_a_fake_fault_that_names_no_gpu_or_xid_is_refused_saying_which_field(
    path: str, body: bytes, says: str
) -> None:
    live = LiveInventory(Inventory((NodeGpu("GPU-a", 0, "m", 1024),), 4))
    tracker = HealthTracker(live, frozenset(DEFAULT_IGNORED_XIDS))
    server = StatusServer("127.0.0.1", 0, Metrics(), tracker)
    server.start()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("POST", path, body=body)
        answer = conn.getresponse()
        assert (answer.status, answer.read().decode()) == (400, f"bad request: {says}\n")
        assert live.snapshot()[1].unhealthy == {}
    finally:
        conn.close()
        server.stop()

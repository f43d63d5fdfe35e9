"""The node layer's status server (`/metrics`, `/healthz`, `/readyz`) as a scraper meets it."""

from __future__ import annotations

import logging
import socket
import struct
import threading

import pytest

from nodegpu.metrics import Metrics, StatusServer


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

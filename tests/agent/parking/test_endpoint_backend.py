"""The endpoint method's calls to an inference engine get the time its memory takes to move:
a stand-in vLLM whose /sleep takes longer than the move timeout alone."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent.parking.backends.base import BackendError, TenantRef
from agent.parking.backends.endpoint import VLLM, EndpointBackend, EndpointTarget
from baton.contract.quiet import QuietErrors

GPU = "GPU-0"


class SlowEngine(QuietErrors, ThreadingHTTPServer):
    """Answers every POST with 200 after `takes` seconds (a model's weights moving)."""

    def __init__(self, takes: float) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.takes = takes
        self.done = threading.Event()  # set when the test ends: no answer waits past it
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: SlowEngine

    def do_POST(self) -> None:
        self.server.done.wait(self.server.takes)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def engine() -> Iterator[SlowEngine]:
    server = SlowEngine(takes=0.3)
    yield server
    server.done.set()
    server.shutdown()
    server.server_close()
    server.thread.join(10)


def backend_for(engine: SlowEngine, declared: int) -> EndpointBackend:
    backend = EndpointBackend(timeout=0.05, copy_gbps=2.0)
    backend.attach(TenantRef("t", (GPU,), declared_bytes=declared))
    backend.configure("t", EndpointTarget(VLLM, (engine.url,)))
    return backend


def test_an_engine_moving_a_large_model_is_not_cut_short(engine: SlowEngine) -> None:
    """0.3 s for 1 GB: past the 0.05 s timeout alone, within the 0.55 s its bytes allow."""
    backend = backend_for(engine, declared=int(1e9))
    start = time.monotonic()
    park = backend.park("t", GPU)
    assert park.bytes == int(1e9) and time.monotonic() - start >= 0.3
    assert backend.restore("t", GPU).direction == "restore"


def test_an_engine_slower_than_its_bytes_allow_fails_the_move(engine: SlowEngine) -> None:
    backend = backend_for(engine, declared=int(0.1e9))  # 0.1 s allowed
    with pytest.raises(BackendError, match=r"POST http://127\.0\.0\.1:\d+/sleep\?level=1"):
        backend.park("t", GPU)

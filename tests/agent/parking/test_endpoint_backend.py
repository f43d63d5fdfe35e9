"""The endpoint method's calls to an inference engine get the time its memory takes to move:
a stand-in vLLM whose /sleep takes longer than the move timeout alone."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import cast

import pytest

from agent.parking.backends.base import BackendError, BackendQuarantined, RecordError, TenantRef
from agent.parking.backends.endpoint import VLLM, EndpointBackend, EndpointTarget
from agent.parking.multi import MultiBackend
from tests.agent.parking.test_methods import Recorder
from tests.agent.server.llmd.test_snapshot_endpoint import Engine

GPU = "GPU-0"


@pytest.fixture
def engine() -> Iterator[Engine]:
    server = Engine(takes=0.3)
    yield server
    server.done.set()
    server.shutdown()
    server.server_close()
    server.thread.join(10)


def backend_for(engine: Engine, declared: int) -> EndpointBackend:
    backend = EndpointBackend(timeout=0.05, copy_gbps=2.0)
    backend.attach(TenantRef("t", (GPU,), declared_bytes=declared))
    backend.configure("t", EndpointTarget(VLLM, (f"http://{engine.url}",)))
    return backend


def test_an_engine_moving_a_large_model_is_not_cut_short(engine: Engine) -> None:
    """0.3 s for 1 GB: past the 0.05 s timeout alone, within the 0.55 s its bytes allow."""
    backend = backend_for(engine, declared=int(1e9))
    start = time.monotonic()
    park = backend.park("t", GPU)
    assert park.bytes == int(1e9) and time.monotonic() - start >= 0.3
    assert backend.restore("t", GPU).direction == "restore"


def test_an_engine_slower_than_its_bytes_allow_fails_the_move(engine: Engine) -> None:
    backend = backend_for(engine, declared=int(0.1e9))  # 0.1 s allowed
    with pytest.raises(BackendError, match=r"POST http://127\.0\.0\.1:\d+/sleep\?level=1"):
        backend.park("t", GPU)


def test_a_restarted_agent_takes_back_the_sleeping_engine(engine: Engine) -> None:
    engine.takes = 0
    backend = backend_for(engine, declared=1000)
    backend.park("t", GPU)
    again = EndpointBackend(timeout=5)
    again.adopt(backend.durable())
    again.attach(TenantRef("t", (GPU,), declared_bytes=1000))
    assert again.state("t").parked_bytes == 1000
    assert again.restore("t", GPU).bytes == 1000
    assert [path for path, _ in engine.seen] == ["/sleep?level=1", "/wake_up"]
    assert again.durable() == {}
    with pytest.raises(RecordError, match=r"tenant 't': 'endpoints' is 'x', not a list"):
        again.adopt({"t": {**backend.durable()["t"], "endpoints": "x"}})


@pytest.mark.parametrize(
    "answer", [b"garbage\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort"]
)
def test_an_engine_answering_something_else_than_http_fails_the_move_naming_it(
    answer: bytes,
) -> None:
    """Not HTTP, or a body cut short: a failed move (retried as any is), in one line."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)

    def answer_once() -> None:  # then nothing listens: GET /is_sleeping is refused at once
        conn, _ = listener.accept()
        with conn, listener:
            conn.recv(65536)
            conn.sendall(answer)

    thread = threading.Thread(target=answer_once, daemon=True)
    thread.start()
    backend = EndpointBackend(timeout=10)
    backend.attach(TenantRef("t", (GPU,), declared_bytes=1))
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    backend.configure("t", EndpointTarget(VLLM, (url,)))
    with listener, pytest.raises(BackendError) as failed:
        backend.park("t", GPU)
    thread.join(10)
    assert str(failed.value).startswith(f"POST {url}/sleep?level=1: no HTTP answer (")
    assert "\n" not in str(failed.value)
    assert backend.state("t").parked_bytes == 0


@pytest.fixture
def second() -> Iterator[Engine]:
    server = Engine()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("direction", ["park", "restore"])
def test_engines_of_one_tenant_are_left_as_counted_when_one_fails(
    engine: Engine, second: Engine, direction: str
) -> None:
    """Two engines (say, two replicas): the second fails, so the first's call is undone and
    the tenant is where `state` counts it, for the retry or the next turn to move it all."""
    engine.takes = 0
    backend = EndpointBackend(timeout=10)
    backend.attach(TenantRef("t", (GPU,), declared_bytes=1))
    backend.configure("t", EndpointTarget(VLLM, (f"http://{engine.url}", f"http://{second.url}")))
    if direction == "restore":
        backend.park("t", GPU)
    second.status = 500
    with pytest.raises(BackendError, match="HTTP 500"):
        getattr(backend, direction)("t", GPU)
    parked = direction == "restore"
    assert (backend.state("t").parked_bytes == 1) is parked
    calls = [path for path, _ in engine.seen]
    assert calls[-2:] == (
        ["/wake_up", "/sleep?level=1"] if parked else ["/sleep?level=1", "/wake_up"]
    )
    second.status = 200
    getattr(backend, direction)("t", GPU)  # the retry moves both
    assert [p for p, _ in engine.seen][-1] == [p for p, _ in second.seen][-1]


def test_engines_that_cannot_be_put_back_as_counted_quarantine_the_tenant(
    engine: Engine, second: Engine
) -> None:
    engine.takes = 0
    engine.fails, second.status = {"/wake_up"}, 500
    backend = EndpointBackend(timeout=10)
    backend.attach(TenantRef("t", (GPU,), declared_bytes=1))
    backend.configure("t", EndpointTarget(VLLM, (f"http://{engine.url}", f"http://{second.url}")))
    with pytest.raises(BackendQuarantined, match=r"HTTP 500.*undoing the park .*some sleep"):
        backend.park("t", GPU)


@pytest.mark.parametrize("direction", ["park", "restore"])
def test_a_move_whose_answer_is_lost_counts_as_the_engine_says(
    engine: Engine, direction: str
) -> None:
    """The engine slept (or woke) but its answer never came: its GET /is_sleeping says where it
    is, so the tenant is counted there and its next turn wakes it."""
    engine.takes = 0
    backend = backend_for(engine, declared=1000)
    if direction == "restore":
        backend.park("t", GPU)
    engine.loses = {"/sleep", "/wake_up"}
    move = getattr(backend, direction)("t", GPU)
    assert move.bytes == 1000 and engine.asleep is (direction == "park")
    assert backend.state("t").parked_bytes == (1000 if direction == "park" else 0)


def test_an_engine_that_does_not_say_whether_it_sleeps_fails_a_lost_move(engine: Engine) -> None:
    """No GET /is_sleeping (404): a lost answer is a failed move, as before, retried as any is."""
    engine.takes, engine.says_state, engine.loses = 0, False, {"/sleep"}
    backend = backend_for(engine, declared=1000)
    with pytest.raises(BackendError, match=r"POST http://127\.0\.0\.1:\d+/sleep\?level=1: "):
        backend.park("t", GPU)
    assert backend.state("t").parked_bytes == 0


def test_a_quarantine_is_kept_across_an_agent_restart(engine: Engine, second: Engine) -> None:
    """The engines some asleep, some not: the restarted agent still gives the tenant no turn."""
    engine.takes = 0
    engine.fails, second.status = {"/wake_up"}, 500
    backend = EndpointBackend(timeout=10)
    backend.attach(TenantRef("t", (GPU,), declared_bytes=1))
    backend.configure("t", EndpointTarget(VLLM, (f"http://{engine.url}", f"http://{second.url}")))
    with pytest.raises(BackendQuarantined) as quarantined:
        backend.park("t", GPU)
    assert backend.state("t").quarantined == str(quarantined.value)
    again = EndpointBackend(timeout=10)
    again.adopt(json.loads(json.dumps(backend.durable())))
    again.attach(TenantRef("t", (GPU,), declared_bytes=1))
    assert again.state("t").quarantined == str(quarantined.value)
    with pytest.raises(RecordError, match=r"tenant 't': 'quarantined' is 3, not a reason"):
        again.adopt({"t": {**backend.durable()["t"], "quarantined": 3}})
    again.detach("t")
    assert again.durable() == {}


def test_a_quarantine_keeps_its_method_across_a_restart_beside_another(
    engine: Engine, second: Engine
) -> None:
    """A node with `fake,endpoint`: the restarted agent reads the tenant from `endpoint` still."""
    engine.takes = 0
    engine.fails, second.status = {"/wake_up"}, 500

    def node() -> MultiBackend:
        multi = MultiBackend({"fake": Recorder("fake", []), "endpoint": EndpointBackend(10)})
        multi.attach(TenantRef("t", (GPU,), declared_bytes=1))
        return multi

    before = node()
    before.pin("t", "endpoint")
    urls = (f"http://{engine.url}", f"http://{second.url}")
    cast(EndpointBackend, before.backends["endpoint"]).configure("t", EndpointTarget(VLLM, urls))
    with pytest.raises(BackendQuarantined) as quarantined:
        before.park("t", GPU)
    after = node()
    after.adopt(json.loads(json.dumps(before.durable())))
    after.attach(TenantRef("t", (GPU,), declared_bytes=1))
    assert after.state("t").quarantined == str(quarantined.value)
    assert after.method_of("t") == "endpoint"


def test_an_engine_that_does_not_answer_its_state_is_not_asked_at_every_grant() -> None:
    """A hung engine (its port takes connections, it answers nothing) costs its GPU's grants
    the state timeout once, not at each of them, under the node's preparer lock."""
    hung = socket.create_server(("127.0.0.1", 0))
    hung.settimeout(5)
    try:
        base = f"http://127.0.0.1:{hung.getsockname()[1]}"
        backend = EndpointBackend(timeout=0.05)
        assert backend.sleeping(VLLM, base) is None
        hung.accept()[0].close()  # it was asked once
        assert backend.sleeping(VLLM, base) is None
        hung.settimeout(0)
        with pytest.raises(BlockingIOError):
            hung.accept()  # and not again
        hung.settimeout(5)  # but a move whose answer was lost asks it still: its own outcome
        assert backend.sleeping(VLLM, base, ask_silent=True) is None
        hung.accept()[0].close()
    finally:
        hung.close()

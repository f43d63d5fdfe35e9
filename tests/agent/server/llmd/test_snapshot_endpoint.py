"""llm-d's app_endpoint: Snapshot/Restore park an inference engine through its own HTTP API,
against a stand-in engine that records what it receives (vLLM: POST /sleep?level=N, POST
/wake_up?tags=...; SGLang: POST /release_memory_occupation and /resume_memory_occupation with
{"tags": [...]}), and only an engine on loopback served by the job's own process."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import pytest

from baton._pb import snapshot_agent_pb2 as sa
from baton.contract.quiet import QuietErrors
from tests.agent.server.llmd.agents import one_group_agent
from tests.agent.server.llmd.llmd_client import SnapshotAgentClient, TimeSliceOrchestratorClient
from tests.agent.server.llmd.test_snapshot_config import _method
from tests.harness.agent import AgentRunner

PATHS = ("/sleep", "/wake_up", "/release_memory_occupation", "/resume_memory_occupation")


class Engine(QuietErrors, ThreadingHTTPServer):
    """Answers vLLM's and SGLang's memory endpoints with 200 (or `status`), recording each,
    after `takes` seconds (its memory moving; `done` cuts the wait short); a 200 moves it
    (`asleep`), which vLLM's GET /is_sleeping reports unless `says_state` is False (404)."""

    def __init__(self, takes: float = 0.0) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.seen: list[tuple[str, Any]] = []
        self.status = 200
        self.fails: set[str] = set()
        """Paths answered 500 whatever `status` says."""
        self.takes = takes
        self.asleep = False
        self.says_state = True
        self.loses: set[str] = set()
        """Paths that move the engine but whose answer is lost (the connection closes)."""
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: Engine

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.server.seen.append((self.path, body))
        if self.server.takes:
            self.server.done.wait(self.server.takes)
        path = self.path.split("?")[0]
        known = path.endswith(PATHS)
        status = 500 if path in self.server.fails else self.server.status if known else 404
        if status == 200:
            self.server.asleep = path.endswith(("/sleep", "/release_memory_occupation"))
        if path in self.server.loses:
            self.close_connection = True
            return
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        if self.path != "/is_sleeping" or not self.server.says_state:
            self.send_error(404)
            return
        body = json.dumps({"is_sleeping": self.server.asleep}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def engine() -> Iterator[Engine]:
    server = Engine()
    yield server
    server.shutdown()
    server.server_close()


def _agent(workdir: str, backend: str = "app,endpoint") -> AgentRunner:
    return one_group_agent(workdir, backend)


@pytest.fixture
def endpoint(workdir: str) -> Iterator[str]:
    runner = _agent(workdir)
    address = f"127.0.0.1:{runner.llmd_port}"
    job = TimeSliceOrchestratorClient(address, "engine", "g")
    assert job.acquire(timeout_sec=10)[0] and job.release()[0]  # the job exists, this process's
    job.close()
    yield address
    runner.stop()


@pytest.fixture
def client(endpoint: str) -> Iterator[SnapshotAgentClient]:
    client = SnapshotAgentClient(endpoint)
    yield client
    client.close()


def config(
    app: sa.App,
    url: str,
    mode: sa.SuspendMode = sa.SUSPEND_MODE_UNSPECIFIED,
    tags: tuple[str, ...] = (),
) -> sa.BackendConfig:
    cfg = sa.AppEndpointConfig(app=app, endpoints=[url], mode=mode, tags=list(tags))
    return sa.BackendConfig(app_endpoint=cfg)


def _done(client: SnapshotAgentClient, op_id: str) -> sa.GetOperationResponse:
    op = client.wait_for_operation(op_id, 0.01)
    assert op.status == sa.OPERATION_STATUS_COMPLETE, op.error
    assert _method(client, op_id) == "endpoint"
    return op


def _state(client: SnapshotAgentClient) -> str:
    return sa.JobState.Name(client.status().job_statuses[0].state)


def test_vllm_sleeps_at_the_modes_level_and_wakes_with_the_tags(
    client: SnapshotAgentClient, engine: Engine
) -> None:
    asleep = config(sa.APP_VLLM, engine.url, sa.SUSPEND_MODE_DISCARD)
    op = _done(client, client.snapshot("engine", "g", asleep))
    assert op.storage_bytes == 1024 * 1024 * 1024 and _state(client) == "JOB_STATE_SAVED"
    awake = config(sa.APP_VLLM, engine.url, tags=("weights", "kv_cache"))
    _done(client, client.restore("engine", "g", awake))
    assert engine.seen == [("/sleep?level=2", None), ("/wake_up?tags=weights&tags=kv_cache", None)]
    _done(client, client.snapshot("engine", "g", config(sa.APP_VLLM, engine.url)))
    assert engine.seen[-1] == ("/sleep?level=1", None), "OFFLOAD (the default) is level 1"
    assert _state(client) == "JOB_STATE_SAVED"


def test_sglang_releases_and_resumes_the_tagged_memory(
    client: SnapshotAgentClient, engine: Engine
) -> None:
    cfg = config(sa.APP_SGLANG, f"http://{engine.url}/engine/", tags=("kv_cache",))
    _done(client, client.snapshot("engine", "g", cfg))
    _done(client, client.restore("engine", "g", config(sa.APP_SGLANG, engine.url)))
    assert engine.seen == [
        ("/engine/release_memory_occupation", {"tags": ["kv_cache"]}),  # its base path kept
        ("/resume_memory_occupation", {}),  # no tags: an empty object, as SGLang needs a body
    ]
    assert _state(client) == "JOB_STATE_RUNNING"


def test_an_engine_that_fails_fails_the_operation(
    client: SnapshotAgentClient, engine: Engine
) -> None:
    engine.status = 500
    op = client.wait_for_operation(
        client.snapshot("engine", "g", config(sa.APP_VLLM, engine.url)), 0.01
    )
    assert op.status == sa.OPERATION_STATUS_FAILED and "HTTP 500" in op.error
    assert _state(client) == "JOB_STATE_RUNNING"


def test_only_the_jobs_own_engine_on_loopback_is_called(
    client: SnapshotAgentClient, engine: Engine
) -> None:
    unserved = engine.url
    engine.shutdown()
    engine.server_close()  # nothing listens there now
    for url in ("10.1.2.3:8000", "http://169.254.169.254:80", unserved):
        with pytest.raises(grpc.RpcError) as err:
            client.snapshot("engine", "g", config(sa.APP_VLLM, url))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, err.value.details()
    with pytest.raises(grpc.RpcError) as bad:
        client.snapshot("engine", "g", config(sa.APP_VLLM, ""))
    assert bad.value.code() == grpc.StatusCode.PERMISSION_DENIED, bad.value.details()


@pytest.mark.parametrize(
    ("before", "after"),
    [("app,endpoint", "app,endpoint"), ("endpoint", "endpoint"), ("endpoint", "app,endpoint")],
)
def test_a_sleeping_engine_is_woken_for_its_turn_after_an_agent_restart(
    workdir: str, engine: Engine, before: str, after: str
) -> None:
    """The engine keeps its memory asleep while the agent restarts (with `--backend` as before,
    or with another method beside): the restarted agent counts it SAVED still, and the job's
    next turn wakes it before it is granted."""
    runner = _agent(workdir, before)
    job = TimeSliceOrchestratorClient(f"127.0.0.1:{runner.llmd_port}", "engine", "g")
    assert job.acquire(timeout_sec=10)[0] and job.release()[0]
    client = SnapshotAgentClient(f"127.0.0.1:{runner.llmd_port}")
    _done(client, client.snapshot("engine", "g", config(sa.APP_VLLM, engine.url)))
    client.close()
    job.close()
    runner.stop()
    runner = _agent(workdir, after)
    try:
        client = SnapshotAgentClient(f"127.0.0.1:{runner.llmd_port}")
        assert _state(client) == "JOB_STATE_SAVED"
        client.close()
        job = TimeSliceOrchestratorClient(f"127.0.0.1:{runner.llmd_port}", "engine", "g")
        granted, _, restored = job.acquire(timeout_sec=10)
        assert granted and restored
        job.close()
        assert engine.seen == [("/sleep?level=1", None), ("/wake_up", None)]
    finally:
        runner.stop()


@pytest.mark.parametrize(
    ("trainer_parked", "says_state"), [(True, True), (False, True), (True, False)]
)
def test_an_engine_restarted_awake_is_parked_again_before_another_jobs_turn(
    workdir: str, engine: Engine, trainer_parked: bool, says_state: bool
) -> None:
    """The engine slept for the trainer's turns, then restarted (a crash, a rollout): awake, it
    holds its memory again. The trainer's next turn (its own wake_up, or one that moves nothing
    on the model's word) asks it first (GET /is_sleeping) and puts it to sleep again before the
    grant. An engine that does not say (404) is counted asleep, as before."""
    trainer_engine = Engine()
    runner = _agent(workdir, "endpoint")
    address = f"127.0.0.1:{runner.llmd_port}"
    client = SnapshotAgentClient(address)
    jobs = [TimeSliceOrchestratorClient(address, job, "g") for job in ("engine", "trainer")]
    sampler, trainer = jobs
    try:
        assert sampler.acquire(timeout_sec=10)[0] and sampler.release()[0]
        _done(client, client.snapshot("engine", "g", config(sa.APP_VLLM, engine.url)))
        assert trainer.acquire(timeout_sec=10)[0] and trainer.release()[0]
        if trainer_parked:
            cfg = config(sa.APP_VLLM, trainer_engine.url)
            _done(client, client.snapshot("trainer", "g", cfg))
        engine.says_state = says_state
        engine.asleep = False  # restarted: its memory is on the GPU again
        assert trainer.acquire(timeout_sec=10)[0]
        assert trainer_engine.asleep is False
        sleeps = [("/sleep?level=1", None)] * (2 if says_state else 1)
        assert engine.seen == sleeps and engine.asleep is says_state
        assert trainer.release()[0]
    finally:
        client.close()
        for job in jobs:
            job.close()
        runner.stop()
        trainer_engine.shutdown()
        trainer_engine.server_close()

"""llm-d's TimeSliceOrchestratorService over the real port, driven by a client written from
their documented behaviour: two jobs alternate, a killed holder frees the group, every code."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from agent.core import errors
from agent.core import events as ev
from agent.server.llmd.edge import status_code
from baton._pb import timeslice_orchestrator_pb2 as ts
from tests.agent.server.llmd.llmd_client import TimeSliceOrchestratorClient
from tests.harness.agent import AgentRunner

ROOT = Path(__file__).resolve().parents[4]
GROUP = "trainers"


@pytest.fixture
def agent(workdir: str) -> Iterator[AgentRunner]:
    runner = AgentRunner(
        workdir, llmd_listen="127.0.0.1:0", llmd_groups=(f"{GROUP}=GPU-0", "samplers=GPU-1")
    ).start()
    yield runner
    runner.stop()


@pytest.fixture
def target(agent: AgentRunner) -> str:
    return f"127.0.0.1:{agent.llmd_port}"


@pytest.fixture
def clients(target: str) -> Iterator[tuple[TimeSliceOrchestratorClient, ...]]:
    made = tuple(TimeSliceOrchestratorClient(target, job, GROUP) for job in ("job-a", "job-b"))
    yield made
    for client in made:
        client.close()


def _wait_queued(agent: AgentRunner, mark: int, tenant: str) -> None:
    agent.wait_event(lambda e: e.kind == ev.QUEUED and e.tenant_id == tenant, since=mark)


def test_two_jobs_alternate(agent: AgentRunner, clients: tuple[TimeSliceOrchestratorClient, ...]):
    a, b = clients
    assert a.list_groups() == ["samplers", GROUP]
    assert a.get_status().group.group_state == ts.GroupStatus.STATE_IDLE
    assert a.acquire()[0] is True
    assert a.acquire() == (True, 0, False), "a second acquire by the holder succeeds at once"
    with ThreadPoolExecutor(1) as pool:
        for _ in range(3):
            mark = agent.mark()
            waiting: Future[tuple[bool, int, bool]] = pool.submit(b.acquire)
            _wait_queued(agent, mark, "llmd/job-b")
            status = a.get_status()
            assert status.group.group_state == ts.GroupStatus.STATE_LOCKED
            assert (status.group.locking_job, status.group.waiter_queue_depth) == ("job-a", 1)
            assert {s.job_id for s in status.agent_job_states} == {"job-a", "job-b"}
            assert a.release() == (True, 1, False), "one waiter: the snapshot is not deferred"
            assert waiting.result(5)[0] is True
            assert a.get_status().group.locking_job == "job-b"
            mark = agent.mark()
            waiting = pool.submit(a.acquire)
            _wait_queued(agent, mark, "llmd/job-a")
            assert b.release() == (True, 1, False)
            assert waiting.result(5)[0] is True
    assert a.release() == (True, 0, True), "nobody waits: the snapshot is deferred"
    group = a.get_status().group
    assert group.group_state == ts.GroupStatus.STATE_IDLE_YIELDED
    assert (group.locking_job, group.loaded_job, group.active_job) == ("", "job-a", "job-a")
    assert group.state_timestamp.ToSeconds() > 0


def until(check: Callable[[], bool], what: str, within: float = 10) -> None:
    """Wait (`within` seconds at most) for `check`; `what` names it if it never comes."""
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"not within {within} s: {what}"
        time.sleep(0.01)


def test_a_job_asking_again_while_its_acquire_waits_waits_for_the_same_turn(
    agent: AgentRunner,
    clients: tuple[TimeSliceOrchestratorClient, ...],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A retry after the client's own timeout (or a second thread): both calls wait, the first
    one's deadline leaves the job's place in the queue to the other, and one turn answers."""
    caplog.set_level(logging.INFO, logger="agent.server.llmd.asking")
    a, b = clients
    a.acquire()
    mark = agent.mark()
    request = ts.AcquireRequest(job_id="job-b", group_id=GROUP)
    first = b.stub.Acquire.future(request, timeout=3)
    _wait_queued(agent, mark, "llmd/job-b")
    again = b.stub.Acquire.future(request, timeout=30)
    joined = "again while 1 earlier Acquire waits: they wait for the same turn"
    until(
        lambda: again.done() or any(joined in r.getMessage() for r in caplog.records),
        "the second Acquire waiting beside the first",
    )
    assert not again.done(), f"the second Acquire was answered: {again.exception()}"
    with pytest.raises(grpc.RpcError) as late:
        first.result()
    assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "1 other Acquire of the job still waits for it, keeping its place" in str(
        late.value.details()
    )
    assert a.get_status().group.waiter_queue_depth == 1
    assert a.release() == (True, 1, False)
    assert again.result(10).success is True
    assert a.get_status().group.locking_job == "job-b"
    assert b.release() == (True, 0, True), "one turn, ended by one yield"
    agent.mark()  # takes in every event published so far
    kinds = [e.kind for e in agent.seen[mark:] if e.tenant_id == "llmd/job-b"]
    assert kinds.count(ev.QUEUED) == 1 and ev.CANCELLED not in kinds, kinds


def test_a_job_asking_while_its_revoked_turn_waits_to_be_given_back_waits_for_it(
    agent: AgentRunner, clients: tuple[TimeSliceOrchestratorClient, ...]
) -> None:
    """job-a's turn is revoked at the maximum hold for job-b (llm-d's API cannot tell job-a so):
    its Acquire meanwhile waits for the turn the node gives back, its deadline leaving that turn
    queued first for it, and is answered with it as job-b yields."""
    a, b = clients
    agent.inspect(lambda service: setattr(service.table, "max_hold", 0.2))
    a.acquire()
    agent.inspect(lambda service: setattr(service.table, "max_hold", 60.0))  # not job-b's
    assert b.acquire(timeout_sec=10)[0] is True  # once job-a's turn is revoked

    def resumes() -> list[str]:
        return agent.inspect(lambda s: [w.tenant_id for w in s.table.waiters.values() if w.front])

    assert resumes() == ["llmd/job-a"]
    with pytest.raises(grpc.RpcError) as late:
        a.acquire(timeout_sec=1)
    assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, late.value.details()
    assert "revoked turn to be given back, which stays first in the queue" in str(
        late.value.details()
    )
    assert resumes() == ["llmd/job-a"], "its deadline left the turn queued for job-a"
    request = ts.AcquireRequest(job_id="job-a", group_id=GROUP)
    again = a.stub.Acquire.future(request, timeout=30)
    until(
        lambda: again.done() or agent.inspect(lambda s: bool(s.turns.resumes.joined)),
        "job-a's Acquire waiting for its revoked turn",
    )
    assert not again.done(), f"the Acquire was answered: {again.exception()}"
    assert b.release() == (True, 1, False)
    assert again.result(10).success is True
    assert a.get_status().group.locking_job == "job-a"
    assert a.release() == (True, 0, True)


def test_a_job_yielding_while_its_revoked_turn_waits_to_be_given_back_ends_it(
    agent: AgentRunner, clients: tuple[TimeSliceOrchestratorClient, ...]
) -> None:
    """job-a's turn is revoked at the maximum hold for job-b as job-a's step ends: its Yield
    ends the turn the node was to give back, which job-a is not granted later."""
    a, b = clients
    agent.inspect(lambda service: setattr(service.table, "max_hold", 0.2))
    a.acquire()
    agent.inspect(lambda service: setattr(service.table, "max_hold", 60.0))  # not job-b's
    assert b.acquire(timeout_sec=10)[0] is True  # once job-a's turn is revoked
    assert a.release() == (True, 0, True), "nobody else waits for the group"
    assert not agent.inspect(lambda service: list(service.table.waiters))
    assert b.release() == (True, 0, True)
    assert a.get_status().group.group_state == ts.GroupStatus.STATE_IDLE_YIELDED
    with pytest.raises(grpc.RpcError) as again:
        a.release()
    assert again.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_a_job_cannot_yield_another_jobs_turn(clients: tuple[TimeSliceOrchestratorClient, ...]):
    a, b = clients
    a.acquire()
    with pytest.raises(grpc.RpcError) as denied:
        b.release()
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "held by job-a" in str(denied.value.details())
    assert a.get_status().group.locking_job == "job-a", "the turn stayed with its holder"
    with pytest.raises(grpc.RpcError) as never:
        b.release(job_id="job-never-seen")
    assert never.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_a_yield_naming_another_group_than_the_jobs_turn_says_so(workdir: str) -> None:
    groups = ("both=GPU-0,GPU-1", f"{GROUP}=GPU-0")
    with AgentRunner(workdir, llmd_listen="127.0.0.1:0", llmd_groups=groups) as agent:
        job = TimeSliceOrchestratorClient(f"127.0.0.1:{agent.llmd_port}", "job-a", "both")
        try:
            assert job.acquire()[0] is True
            with pytest.raises(grpc.RpcError) as denied:
                job.release(group_id=GROUP)
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "(held by job-a, on another group: yield with that group_id)" in str(
                denied.value.details()
            )
            assert job.release() == (True, 0, True)  # its own group's yield ends it
        finally:
            job.close()


def test_every_status_code_the_reference_names(
    agent: AgentRunner, clients: tuple[TimeSliceOrchestratorClient, ...]
):
    a, b = clients
    cases = [
        (lambda: a.acquire(group_id="no-such-group"), grpc.StatusCode.NOT_FOUND),
        (lambda: a.get_status("no-such-group"), grpc.StatusCode.NOT_FOUND),
        (lambda: a.release(group_id="no-such-group"), grpc.StatusCode.NOT_FOUND),
        (lambda: a.acquire(job_id=" "), grpc.StatusCode.INVALID_ARGUMENT),
    ]
    for call, code in cases:
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == code, err.value.details()
    a.acquire()
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as late:
        b.acquire(timeout_sec=0.3)
    assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 3
    with pytest.raises(grpc.RpcError) as explained:
        b.acquire(timeout_sec=2.0)
    assert explained.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "behind holder llmd/job-a" in str(explained.value.details()), "answered before it"
    assert a.get_status().group.waiter_queue_depth == 0, "the caller's deadline left no ghost"
    expired = agent.wait_event(lambda e: e.kind == ev.EXPIRED and e.tenant_id == "llmd/job-b")
    assert "behind holder llmd/job-a" in expired.detail


def test_a_job_killed_while_holding_frees_the_group_within_a_second(
    agent: AgentRunner, target: str, clients: tuple[TimeSliceOrchestratorClient, ...]
):
    _, b = clients
    job = subprocess.Popen(
        [sys.executable, "-m", "tests.agent.server.llmd.job_process", target, "job-a", GROUP],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert job.stdout is not None and job.stdout.readline().strip() == "held"
        mark = agent.mark()
        got: list[tuple[bool, int, bool]] = []
        waiter = threading.Thread(target=lambda: got.append(b.acquire(timeout_sec=10)))
        waiter.start()
        _wait_queued(agent, mark, "llmd/job-b")
        killed = time.monotonic()
        job.kill()
        waiter.join(5)
        assert got, "the waiting job never got the turn"
        assert time.monotonic() - killed < 1.0
        assert b.get_status().group.locking_job == "job-b"
    finally:
        job.kill()
        job.wait(5)
        assert job.stdin is not None and job.stdout is not None
        job.stdin.close()
        job.stdout.close()


def test_a_wait_a_refusal_kept_answers_resource_exhausted_with_its_numbers() -> None:
    refused = errors.WaitRefused("it waited because parking would exceed the host budget by 5 GiB")
    assert status_code(refused) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (
        status_code(errors.AcquireTimeout("behind a holder")) == grpc.StatusCode.DEADLINE_EXCEEDED
    )

"""llm-d jobs whose callers the agent cannot watch (their process is not found: on another host,
here an empty `--proc-root`): a job no call names for `--llmd-forget-idle-after` leaves the node
as a departed tenant, unless it holds or waits for a turn or has memory parked."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.core import events as ev
from agent.parking.setup import ParkingOptions, parse_fake_gpus
from baton._pb import snapshot_agent_pb2 as sa
from baton._pb import timeslice_orchestrator_pb2 as ts
from commands.localnode.procs import wait_for
from tests.agent.server.llmd.agents import one_group_agent
from tests.agent.server.llmd.llmd_client import (
    SnapshotAgentClient,
    TimeSliceOrchestratorClient,
    register_workload,
)
from tests.harness.agent import AgentRunner

IDLE = 0.3
HOUR = 3600.0


class FakeClock:
    """The llm-d jobs' idle timers (`Jobs.call_later`) on a clock that moves only as `advance`
    says; both are called on the agent's loop."""

    def __init__(self) -> None:
        self.now = 0.0
        self._timers: list[tuple[asyncio.TimerHandle, Callable[..., object], tuple[Any, ...]]] = []

    @classmethod
    def of(cls, agent: AgentRunner) -> FakeClock:
        """A clock the agent's llm-d jobs set their idle timers on from now."""
        clock = cls()
        assert agent.agent.llmd is not None and agent.agent.llmd.jobs is not None
        jobs = agent.agent.llmd.jobs
        agent.inspect(lambda s: setattr(jobs, "call_later", clock.call_later))
        return clock

    def call_later(
        self, delay: float, callback: Callable[..., object], *args: Any
    ) -> asyncio.TimerHandle:
        timer = asyncio.TimerHandle(self.now + delay, callback, args, asyncio.get_running_loop())
        self._timers.append((timer, callback, args))
        return timer

    def advance(self, seconds: float) -> None:
        """Move the clock `seconds` on, firing the timers due meanwhile, earliest first."""
        end = self.now + seconds
        while due := [t for t in self._timers if not t[0].cancelled() and t[0].when() <= end]:
            first = min(due, key=lambda t: t[0].when())
            self._timers.remove(first)
            self.now = first[0].when()
            first[1](*first[2])
        self.now = end


def _gone(agent: AgentRunner, job: str) -> str:
    """The detail of the `tenant_gone` event of job `job` (waited for, bounded)."""
    tenant = f"llmd/{job}"
    return agent.wait_event(lambda e: e.kind == ev.TENANT_GONE and e.tenant_id == tenant).detail


@pytest.fixture
def unwatched(workdir: str) -> Iterator[Path]:
    """A /proc in which no caller's process is found."""
    proc = Path(workdir) / "proc"
    proc.mkdir()
    yield proc


def test_a_job_nobody_names_leaves_and_its_series_end(workdir: str, unwatched: Path) -> None:
    agent = AgentRunner(
        workdir,
        llmd_listen="127.0.0.1:0",
        llmd_groups=("g=GPU-0",),
        proc_root=str(unwatched),
        llmd_forget_idle_after=IDLE,
        forget_departed_after=0.05,
    ).start()
    client = TimeSliceOrchestratorClient(f"127.0.0.1:{agent.llmd_port}", "run-1", "g")
    try:
        assert client.acquire(timeout_sec=10)[0] is True
        assert client.release() == (True, 0, True)
        assert 'tenant="llmd/run-1"' in agent.http("/metrics")[1]
        detail = _gone(agent, "run-1")
        assert "--llmd-forget-idle-after" in detail, detail
        assert "llmd/run-1" not in agent.inspect(lambda s: set(s.tenants.tenants))
        status = client.get_status()
        assert list(status.agent_job_states) == [], "the forgotten job is not listed"
        assert (status.group.active_job, status.group.loaded_job) == ("", "")
        assert status.group.group_state == ts.GroupStatus.STATE_IDLE
        assert client.list_groups() == ["g"]

        def series_gone() -> str | None:
            metrics = agent.http("/metrics")[1]
            return None if 'tenant="llmd/run-1"' in metrics else metrics

        wait_for("llmd/run-1's series to leave /metrics", series_gone, 10, every=0.02)
        assert client.acquire(timeout_sec=10)[0] is True, "a later call brings it back"
        assert "llmd/run-1" in agent.inspect(lambda s: set(s.tenants.tenants))
    finally:
        client.close()
        agent.stop()


def test_a_job_holding_a_turn_or_parked_memory_stays(workdir: str, unwatched: Path) -> None:
    gpus = sorted(parse_fake_gpus("3x1024"))
    agent = AgentRunner(
        workdir,
        parking=ParkingOptions(backend="app", fake_gpus="3x1024"),
        llmd_listen="127.0.0.1:0",
        llmd_groups=(f"g={gpus[0]}", f"h={gpus[1]}", f"k={gpus[2]}"),
        proc_root=str(unwatched),
        llmd_forget_idle_after=IDLE,
    ).start()
    target = f"127.0.0.1:{agent.llmd_port}"
    holder = TimeSliceOrchestratorClient(target, "holder", "k")
    last = TimeSliceOrchestratorClient(target, "last", "h")
    snapshots = SnapshotAgentClient(target)
    restored: list[list[str]] = []
    workload = register_workload(target, "parked", "g", lambda m, t: None, restored.append)
    try:
        assert holder.acquire(timeout_sec=10)[0] is True  # and keeps its turn
        agent.wait_event(lambda e: e.kind == ev.CONNECTED and e.tenant_id == "llmd/parked")
        op = snapshots.wait_for_operation(snapshots.snapshot("parked", "g"), 0.01)
        assert op.status == sa.OPERATION_STATUS_COMPLETE, op.error
        mark = agent.mark()
        workload.close()  # as between reconnects: its memory is parked, in its process
        agent.wait_event(
            lambda e: e.kind == ev.DISCONNECTED and e.tenant_id == "llmd/parked", since=mark
        )
        assert last.acquire(timeout_sec=10)[0] is True
        last.release()
        # Named last, `last` leaves last of those that may: the others were looked at before.
        _gone(agent, "last")
        tenants = agent.inspect(lambda s: set(s.tenants.tenants))
        assert {"llmd/holder", "llmd/parked"} <= tenants, tenants
        states = {j.job_id: j.state for j in snapshots.status().job_statuses}
        assert states["parked"] == sa.JOB_STATE_SAVED, states
        mark = agent.mark()
        workload = register_workload(target, "parked", "g", lambda m, t: None, restored.append)
        agent.wait_event(
            lambda e: e.kind == ev.CONNECTED and e.tenant_id == "llmd/parked", since=mark
        )
        op = snapshots.wait_for_operation(snapshots.restore("parked", "g"), 0.01)
        assert op.status == sa.OPERATION_STATUS_COMPLETE, op.error
        assert restored == [[]], "its memory came back"
    finally:
        workload.close()
        for client in (holder, last, snapshots):
            client.close()
        agent.stop()


def test_a_job_with_memory_on_a_gpu_stays_until_it_has_none(workdir: str, unwatched: Path) -> None:
    """Forgotten, its memory would be room the next turn counts on: it stays while the agent
    counts any of it on a GPU, and leaves once none is (under a method other than `app`, whose
    memory is its WorkloadChannels' processes', gone with them: the test above)."""
    agent = one_group_agent(workdir, "fake", proc_root=str(unwatched), llmd_forget_idle_after=IDLE)
    client = TimeSliceOrchestratorClient(f"127.0.0.1:{agent.llmd_port}", "mem", "g")
    try:
        assert client.acquire(timeout_sec=10)[0] is True
        # What the fake GPU would count of a caller's allocations, which a job with no
        # process found has none of: 1 MiB on its GPU, as the node's model has it.
        agent.inspect(lambda s: setattr(s.preparer, "on_gpus", lambda tenant: 1 << 20))
        mark = agent.mark()
        assert client.release()[0] is True
        with pytest.raises(AssertionError):  # three idle times: looked at, and kept
            agent.wait_event(lambda e: e.kind == ev.TENANT_GONE, timeout=3 * IDLE, since=mark)
        agent.inspect(lambda s: delattr(s.preparer, "on_gpus"))
        assert "--llmd-forget-idle-after" in _gone(agent, "mem")
    finally:
        client.close()
        agent.stop()


def test_a_reconnecting_workload_is_not_forgotten(workdir: str, unwatched: Path) -> None:
    """A job's idle time counts from its WorkloadChannel's close, not from the last call: a
    workload reconnecting as its hour comes is not forgotten (its place, its accounting and
    what the agent knows of its memory with it); one that does not come back leaves an hour
    after its channel closed."""
    agent = one_group_agent(workdir, "app", proc_root=str(unwatched), llmd_forget_idle_after=HOUR)
    clock = FakeClock.of(agent)
    target = f"127.0.0.1:{agent.llmd_port}"
    client = TimeSliceOrchestratorClient(target, "run", "g")
    workload = register_workload(target, "run", "g", lambda m, t: None, lambda t: None)
    try:
        agent.wait_event(lambda e: e.kind == ev.CONNECTED and e.tenant_id == "llmd/run")
        assert client.acquire(timeout_sec=10)[0] is True
        assert client.release()[0] is True
        agent.inspect(lambda s: clock.advance(HOUR))  # unnamed, but its channel is open
        agent.inspect(lambda s: clock.advance(HOUR - 1))
        mark = agent.mark()
        workload.close()  # the workload reconnects, a second before its next look
        agent.wait_event(
            lambda e: e.kind == ev.DISCONNECTED and e.tenant_id == "llmd/run", since=mark
        )
        agent.inspect(lambda s: clock.advance(1))
        assert "llmd/run" in agent.inspect(lambda s: set(s.tenants.tenants)), "forgotten"
        workload = register_workload(target, "run", "", lambda m, t: None, lambda t: None)
        agent.wait_event(lambda e: e.kind == ev.CONNECTED and e.tenant_id == "llmd/run", since=mark)
        assert not [e for e in agent.seen if e.kind == ev.TENANT_GONE]
        mark = agent.mark()
        workload.close()  # and goes for good: it leaves an hour after
        agent.wait_event(
            lambda e: e.kind == ev.DISCONNECTED and e.tenant_id == "llmd/run", since=mark
        )
        agent.inspect(lambda s: clock.advance(HOUR - 1))
        assert "llmd/run" in agent.inspect(lambda s: set(s.tenants.tenants))
        agent.inspect(lambda s: clock.advance(1))
        assert "--llmd-forget-idle-after" in _gone(agent, "run")
    finally:
        workload.close()
        client.close()
        agent.stop()


def test_a_job_whose_long_acquire_just_timed_out_is_not_forgotten(
    workdir: str, unwatched: Path
) -> None:
    """An Acquire names its job until it is answered: a job that waited in the queue longer
    than its idle time, and whose Acquire's deadline has just come, is not forgotten before
    llm-d's client asks again (it would come back a new job, its accounting a departed one's)."""
    agent = AgentRunner(
        workdir,
        llmd_listen="127.0.0.1:0",
        llmd_groups=("g=GPU-0",),
        proc_root=str(unwatched),
        llmd_forget_idle_after=HOUR,
    ).start()
    clock = FakeClock.of(agent)
    target = f"127.0.0.1:{agent.llmd_port}"
    holder = TimeSliceOrchestratorClient(target, "holder", "g")
    waiting = TimeSliceOrchestratorClient(target, "waiting", "g")
    try:
        assert holder.acquire(timeout_sec=10)[0] is True  # and keeps its turn
        with ThreadPoolExecutor(1) as pool:
            asked = pool.submit(waiting.acquire, timeout_sec=2)
            agent.wait_event(lambda e: e.kind == ev.QUEUED and e.tenant_id == "llmd/waiting")
            agent.inspect(lambda s: clock.advance(HOUR))  # it waits: it stays
            agent.inspect(lambda s: clock.advance(HOUR - 1))
            with pytest.raises(grpc.RpcError):
                asked.result(timeout=10)  # its deadline came
        agent.wait_event(  # and it is out of the queue: its call has ended
            lambda e: e.kind in (ev.EXPIRED, ev.CANCELLED) and e.tenant_id == "llmd/waiting"
        )
        agent.inspect(lambda s: clock.advance(1))  # a second before llm-d's client asks again
        assert "llmd/waiting" in agent.inspect(lambda s: set(s.tenants.tenants)), "forgotten"
        agent.inspect(lambda s: clock.advance(HOUR - 1))
        assert "--llmd-forget-idle-after" in _gone(agent, "waiting")
    finally:
        holder.close()
        waiting.close()
        agent.stop()

"""The agent's seams to the residency layer: prepare/revoke/forget, NoRoom, tenant callbacks."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Collection, Iterator, Sequence
from typing import Any

import grpc
import pytest

from agent.client import AcquireTimeout, Baton, LeaseInfo
from agent.core import events as ev
from agent.core.errors import CallbackFailed
from agent.core.residency import NoRoom
from agent.node.state import StateStore
from agent.server import turn_state
from agent.wire.handshake import watch_metadata
from baton._pb import agent_pb2 as pb
from baton._pb import agent_pb2_grpc
from tests.harness.agent import AgentRunner


class RecordingPreparer:
    """A TurnPreparer that records calls and refuses room to tenants in `no_room`."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.ahead: list[tuple[str, tuple[str, ...], frozenset[str]]] = []
        self.no_room: set[str] = set()
        self.cannot_park: set[str] = set()
        self.refused = threading.Event()
        self.forgotten = threading.Event()

    async def prepare(self, tenant_id: str, gpus: Sequence[str], handed: bool = False) -> None:
        self.calls.append(("prepare", tenant_id))
        if tenant_id in self.no_room:
            self.refused.set()
            raise NoRoom(f"parking for {tenant_id} would exceed the host budget by 5 GiB")

    async def prepare_ahead(
        self, tenant_id: str, gpus: Sequence[str], holders: Collection[str] = ()
    ) -> None:
        self.ahead.append((tenant_id, tuple(gpus), frozenset(holders)))

    def held(self, tenant_id: str, gpus: Sequence[str]) -> None:
        pass

    def released(self, tenant_id: str, gpus: Sequence[str]) -> None:
        pass

    async def revoke(self, tenant_id: str, gpus: Sequence[str], *_: Any) -> bool:
        self.calls.append(("revoke", tenant_id))
        if tenant_id in self.cannot_park:
            raise NoRoom(f"park of {tenant_id} failed 3 times; last error: lock timed out")
        return True

    async def forget(self, tenant_id: str) -> None:
        self.calls.append(("forget", tenant_id))
        self.forgotten.set()

    def status(self) -> dict[str, Any]:
        return {"calls": len(self.calls)}

    def residency_of(self, tenant_id: str) -> dict[str, str]:
        return {}

    def on_gpus(self, tenant_id: str) -> int:
        return 0

    def parked_by_tenant(self) -> dict[str, int]:
        return {}

    def rescan(self, tenant_id: str) -> None:
        pass

    def durable(self) -> dict[str, Any]:
        return {}

    def reinstate(self, saved: dict[str, Any]) -> None:
        pass


@pytest.fixture
def preparer() -> RecordingPreparer:
    return RecordingPreparer()


@pytest.fixture
def seam_agent(workdir: str, preparer: RecordingPreparer) -> Iterator[AgentRunner]:
    runner = AgentRunner(workdir, preparer=preparer, max_hold=0.3).start()
    yield runner
    runner.stop()


@pytest.fixture
def clients(seam_agent: AgentRunner) -> Iterator[dict[str, Baton]]:
    made: dict[str, Baton] = {}

    class Factory(dict[str, Baton]):
        def __missing__(self, name: str) -> Baton:
            client = Baton(seam_agent.socket, ["GPU-0"], name=name, connect_timeout=5)
            client.connect()
            made[name] = self[name] = client
            return client

    yield Factory()
    for client in made.values():
        client.close()


@pytest.fixture
def no_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    """No snapshot within a test: what a restart finds is the journal's."""
    monkeypatch.setattr(turn_state, "SAVE_DELAY_S", 60.0)


def test_overdue_holder_is_revoked_then_resumed_first(
    no_snapshot: None,
    seam_agent: AgentRunner,
    preparer: RecordingPreparer,
    clients: dict[str, Baton],
) -> None:
    a, b = clients["a"], clients["b"]
    first = a.acquire()
    waiting = threading.Thread(target=b.acquire, daemon=True)
    waiting.start()
    revoked = seam_agent.wait_event(lambda e: e.kind == "revoked", timeout=5)
    assert revoked.tenant_id == "local/a" and revoked.lease_id == first.lease_id
    waiting.join(5)
    assert b.lease is not None
    # An agent killed now comes back with b's turn alone: the revoked one's end is journaled.
    restarted = StateStore(seam_agent.config.state_dir).load()
    assert [x.lease_id for x in restarted.leases] == [b.lease.lease_id]
    assert ("revoke", "local/a") in preparer.calls
    assert preparer.calls.index(("revoke", "local/a")) < preparer.calls.index(
        ("prepare", "local/b")
    )
    queue = seam_agent.status()["gpus"]["GPU-0"]["queue"]
    assert queue == [{**queue[0], "tenant_id": "local/a", "resuming": True}]
    mark = seam_agent.mark()
    b.yield_()
    resumed = seam_agent.wait_event(lambda e: e.kind == "granted", since=mark)
    assert resumed.tenant_id == "local/a"
    assert resumed.tokens["GPU-0"] == first.fencing_tokens["GPU-0"] + 2


def revoked_unparked(
    seam_agent: AgentRunner, preparer: RecordingPreparer, clients: dict[str, Baton]
) -> tuple[LeaseInfo, threading.Thread, ev.Event]:
    """ "a" holds and cannot be parked, "b" waits on a thread: a's revocation failed (retried
    every 0.2 s). a's lease, b's waiting thread, and the failure's event."""
    preparer.cannot_park.add("local/a")
    seam_agent.inspect(lambda service: setattr(service.revocations, "retry_s", 0.2))
    first = clients["a"].acquire()
    waiting = threading.Thread(target=clients["b"].acquire, daemon=True)
    waiting.start()
    failed = seam_agent.wait_event(lambda e: e.kind == "revoke_failed", timeout=5)
    return first, waiting, failed


def test_a_holder_that_cannot_be_parked_keeps_the_gpu_and_its_waiter_hears_why(
    seam_agent: AgentRunner, preparer: RecordingPreparer, clients: dict[str, Baton]
) -> None:
    b = clients["b"]
    first, waiting, failed = revoked_unparked(seam_agent, preparer, clients)
    assert failed.tenant_id == "local/a" and "lock timed out" in failed.detail
    gpu = seam_agent.status()["gpus"]["GPU-0"]
    assert gpu["holder"] == "local/a" and gpu["lease_id"] == first.lease_id
    assert "could not be parked" in (gpu["queue"][0]["blocked"] or "")
    assert b.lease is None
    mark = seam_agent.mark()
    preparer.cannot_park.clear()
    revoked = seam_agent.wait_event(lambda e: e.kind == "revoked", since=mark, timeout=5)
    assert revoked.lease_id == first.lease_id
    waiting.join(5)
    assert b.lease is not None


def test_no_room_keeps_the_waiter_queued_until_the_node_changes(
    seam_agent: AgentRunner, preparer: RecordingPreparer, clients: dict[str, Baton]
) -> None:
    a, b = clients["a"], clients["b"]
    a.acquire()
    preparer.no_room.add("local/b")
    waiting = threading.Thread(target=b.acquire, daemon=True)
    mark = seam_agent.mark()
    waiting.start()
    seam_agent.wait_event(lambda e: e.kind == "queued" and e.tenant_id == "local/b", since=mark)
    a.yield_()
    assert preparer.refused.wait(5)
    queue = seam_agent.status()["gpus"]["GPU-0"]["queue"]
    assert "exceed the host budget" in queue[0]["blocked"]
    assert seam_agent.status()["residency"] == {"calls": len(preparer.calls)}
    attempts = preparer.calls.count(("prepare", "local/b"))
    preparer.no_room.clear()
    mark = seam_agent.mark()
    clients["c"]  # a registration changes the node: prepare is tried again
    seam_agent.wait_event(lambda e: e.kind == "granted" and e.tenant_id == "local/b", since=mark)
    assert preparer.calls.count(("prepare", "local/b")) == attempts + 1
    waiting.join(5)
    assert b.lease is not None


def test_a_waiter_whose_room_cannot_be_made_hears_why_when_it_times_out(
    seam_agent: AgentRunner, preparer: RecordingPreparer, clients: dict[str, Baton]
) -> None:
    a, b = clients["a"], clients["b"]
    a.acquire()
    a.yield_()
    preparer.no_room.add("local/b")  # e.g. a's park failed: its on_park raised
    with pytest.raises(AcquireTimeout, match=r"it waited because .*exceed the host budget"):
        b.acquire(timeout=0.5)


def test_the_waiter_due_next_is_named_ahead_once_while_the_gpu_is_held(
    seam_agent: AgentRunner, preparer: RecordingPreparer, clients: dict[str, Baton]
) -> None:
    a, b, c = clients["a"], clients["b"], clients["c"]
    a.acquire()
    assert preparer.ahead == []  # nobody waits: nothing to prepare ahead
    waiters = [threading.Thread(target=t.acquire, daemon=True) for t in (b, c)]
    for waiter in waiters:
        mark = seam_agent.mark()
        waiter.start()
        seam_agent.wait_event(lambda e: e.kind == "queued", since=mark)
    assert preparer.ahead == [("local/b", ("GPU-0",), frozenset({"local/a"}))]  # c is not next
    mark = seam_agent.mark()
    a.yield_()
    seam_agent.wait_event(lambda e: e.kind == "granted" and e.tenant_id == "local/b", since=mark)
    assert preparer.ahead[1:] == [("local/c", ("GPU-0",), frozenset({"local/b"}))]
    waiters[0].join(5)
    b.yield_()
    waiters[1].join(5)
    assert len(preparer.ahead) == 2


def test_departed_tenant_is_forgotten(
    seam_agent: AgentRunner, preparer: RecordingPreparer, clients: dict[str, Baton]
) -> None:
    clients["a"].acquire()
    clients["a"].close()
    assert preparer.forgotten.wait(5)
    assert ("forget", "local/a") in preparer.calls


def test_call_tenant_runs_the_clients_callbacks(seam_agent: AgentRunner) -> None:
    release = threading.Event()

    def on_park(gpu: str) -> int:
        return 1 << 20 if gpu == "GPU-0" else 0

    def on_restore(gpu: str) -> int:
        if gpu == "GPU-slow":
            release.wait(10)
        raise RuntimeError(f"cannot restore {gpu}")

    client = Baton(seam_agent.socket, ["GPU-0"], name="cb", on_park=on_park, on_restore=on_restore)
    plain = Baton(seam_agent.socket, ["GPU-0"], name="plain")
    try:
        client.connect()
        plain.connect()
        sessions = seam_agent.service.sessions
        assert seam_agent.call(sessions.call_tenant("local/cb", "park", "GPU-0", 5)) == 1 << 20
        with pytest.raises(CallbackFailed, match="cannot restore GPU-0"):
            seam_agent.call(sessions.call_tenant("local/cb", "restore", "GPU-0", 5))
        # A restore runs only where this process parked: a GPU it never parked is back already.
        assert seam_agent.call(sessions.call_tenant("local/cb", "restore", "GPU-1", 5)) == 0
        assert seam_agent.call(sessions.call_tenant("local/cb", "park", "GPU-slow", 5)) == 0
        with pytest.raises(CallbackFailed, match=r"within 0\.2 s"):
            seam_agent.call(sessions.call_tenant("local/cb", "restore", "GPU-slow", 0.2))
        release.set()
        with pytest.raises(CallbackFailed, match="no session with an on_park"):
            seam_agent.call(sessions.call_tenant("local/plain", "park", "GPU-0", 5))
    finally:
        client.close()
        plain.close()


def test_watch_events_streams_grants_with_fencing_tokens(
    seam_agent: AgentRunner, clients: dict[str, Baton]
) -> None:
    with grpc.insecure_channel(f"unix:{seam_agent.socket}") as channel:
        stream = agent_pb2_grpc.AgentStub(channel).WatchEvents(
            pb.WatchEventsRequest(),
            timeout=10,
            metadata=watch_metadata(seam_agent.socket, seam_agent.config.state_dir),
        )
        assert next(stream).kind == "watching"  # subscribed: nothing from here on is missed
        seen: list[pb.Event] = []
        clients["a"].acquire()
        clients["a"].yield_()
        for event in stream:
            seen.append(event)
            if event.kind == "yielded":
                break
        stream.cancel()
    kinds = [e.kind for e in seen if e.tenant_id == "local/a"]
    assert kinds[-3:] == ["queued", "granted", "yielded"]
    granted = next(e for e in seen if e.kind == "granted")
    assert granted.fencing_tokens["GPU-0"] >= 1 and granted.at > 0


def test_a_watch_that_falls_behind_ends_saying_so_rather_than_skipping_events(
    seam_agent: AgentRunner,
) -> None:
    """More events than a watch's backlog come while its watcher reads none: the watch must not
    go on as if nothing were missing; it ends with one line saying events were lost."""
    with grpc.insecure_channel(f"unix:{seam_agent.socket}") as channel:
        stream = agent_pb2_grpc.AgentStub(channel).WatchEvents(
            pb.WatchEventsRequest(),
            timeout=10,
            metadata=watch_metadata(seam_agent.socket, seam_agent.config.state_dir),
        )
        assert next(stream).kind == "watching"

        def flood(service: Any) -> None:  # in one go on the agent's loop: the watch reads none
            for n in range(3000):
                service.events.publish(ev.Event(ev.QUEUED, f"local/flood-{n}", at=float(n)))

        seam_agent.inspect(flood)
        shown: list[pb.Event] = []
        with pytest.raises(grpc.RpcError) as ended:
            shown.extend(stream)
        stream.cancel()
    assert ended.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, ended.value
    assert "lost" in str(ended.value.details()), ended.value.details()
    flood_shown = [int(e.tenant_id.rsplit("-", 1)[1]) for e in shown if "flood" in e.tenant_id]
    assert flood_shown == list(range(len(flood_shown))), "events skipped without a word"


def test_a_holder_parked_at_the_retry_hands_the_gpu_to_the_waiter_it_was_revoked_for(
    seam_agent: AgentRunner, preparer: RecordingPreparer, clients: dict[str, Baton]
) -> None:
    b = clients["b"]
    first, waiting, _ = revoked_unparked(seam_agent, preparer, clients)
    mark = seam_agent.mark()
    preparer.cannot_park.clear()
    revoked = seam_agent.wait_event(lambda e: e.kind == "revoked", since=mark, timeout=5)
    assert revoked.lease_id == first.lease_id
    seam_agent.wait_event(lambda e: e.kind == "granted" and e.tenant_id == "local/b", since=mark)
    granted = [e.tenant_id for e in seam_agent.seen[mark:] if e.kind == "granted"]
    assert granted[0] == "local/b"  # not the parked holder, handed its turn straight back
    waiting.join(5)
    assert b.lease is not None


def test_a_failed_revocation_whose_waiter_left_sets_no_timer_at_its_retry_time(
    seam_agent: AgentRunner, preparer: RecordingPreparer, clients: dict[str, Baton]
) -> None:
    """ "a" could not be parked and "b", the waiter it was revoked for, gave up: once the retry
    time has come the agent has nothing to retry, and does not set its timer for it (due at
    once, again and again, it spun the agent's loop until "a" yielded)."""
    preparer.cannot_park.add("local/a")
    seam_agent.inspect(lambda service: setattr(service.revocations, "retry_s", 60.0))
    clients["a"].acquire()
    mark = seam_agent.mark()
    with pytest.raises(AcquireTimeout):
        clients["b"].acquire(timeout=1.0)
    seam_agent.wait_event(lambda e: e.kind == "revoke_failed", since=mark)
    seam_agent.wait_event(lambda e: e.kind == "expired" and e.tenant_id == "local/b", since=mark)

    async def timers_after_the_retry_time() -> int:
        service = seam_agent.service
        clock = service.turns._clock
        fired, on_timer = [0], clock._on_timer

        def counted() -> None:
            fired[0] += 1
            on_timer()

        clock._on_timer = counted  # type: ignore[method-assign]
        retry_at = service.revocations.retry_at
        assert retry_at, "the failed revocation is to be tried again"
        for lease_id in retry_at:  # its time has come
            retry_at[lease_id] = service.state.clock() - 1.0
        service.turns.retell()
        for _ in range(100):  # loop steps, not time
            await asyncio.sleep(0)
        return fired[0]

    assert seam_agent.call(timers_after_the_retry_time()) <= 1
    assert seam_agent.status()["gpus"]["GPU-0"]["holder"] == "local/a"

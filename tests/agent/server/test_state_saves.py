"""The whole state is saved after a handoff, not in its step: once per `SAVE_DELAY_S` with every
change made meanwhile; on close whatever is due. Moves are journaled with the grant they made
room for, else in the next step, the snapshot waiting as before. A yield is answered in the step
that ended the turn."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from agent.core import events as ev
from agent.node.state import JOURNAL_FILE, PersistedState, StateStore
from agent.server import turn_state
from agent.server.service import LeaseService
from agent.server.session_stream import SessionStream
from baton._pb import agent_pb2 as pb
from tests.agent.server.test_grant_step import GPU, Link, service, tenant


class CountingStore(StateStore):
    """A state store that remembers what it was handed to save, and when."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.saved: list[tuple[float, PersistedState]] = []
        self.changed = asyncio.Event()

    def save_soon(self, state: PersistedState) -> None:
        self.saved.append((time.monotonic(), state))
        self.changed.set()
        super().save_soon(state)


@pytest.fixture(autouse=True)
def slow_saves(monkeypatch: pytest.MonkeyPatch) -> float:
    """A delay no step of these tests comes near, however loaded the machine."""
    monkeypatch.setattr(turn_state, "SAVE_DELAY_S", 0.5)
    return 0.5


async def next_save(store: CountingStore) -> tuple[float, PersistedState]:
    store.changed.clear()
    await asyncio.wait_for(store.changed.wait(), 5)
    return store.saved[-1]


def test_turns_taken_within_the_delay_are_saved_once_after_it_with_all_of_them(
    tmp_path: Path,
) -> None:
    async def turns() -> None:
        store = CountingStore(tmp_path)
        agent = service(store)
        store.saved.clear()
        started = time.monotonic()
        for _ in range(5):  # five turns, all within one event-loop step
            held = await agent.acquire(tenant("a"), [GPU], timeout=5)
            agent.yield_(tenant("a"), held.lease.lease_id)
        last = await agent.acquire(tenant("b"), [GPU], timeout=5)
        assert store.saved == []  # not in the steps of the handoffs
        at, saved = await next_save(store)
        assert at - started >= turn_state.SAVE_DELAY_S
        assert [x.lease_id for x in saved.leases] == [last.lease.lease_id]
        assert saved.accounting  # the turns' GPU time is in it
        await agent.close()  # saves what is due: nothing, all six changes are in that one
        assert len(store.saved) == 1

    asyncio.run(asyncio.wait_for(turns(), 10))


def test_moves_are_journaled_in_the_next_step_while_the_snapshot_waits(tmp_path: Path) -> None:
    parked = {"default/a": {"GPU-x": 1024}}

    async def moved() -> None:
        store = CountingStore(tmp_path)
        agent = service(store)
        agent.state.preparer.durable = lambda: parked  # type: ignore[method-assign]
        held = await agent.acquire(tenant("a"), [GPU], timeout=5)
        store.saved.clear()
        agent.yield_(tenant("a"), held.lease.lease_id)  # a save is now due in SAVE_DELAY_S
        agent.state.persist()  # what the residency layer calls after a park or a restore
        journal = tmp_path / JOURNAL_FILE
        assert '"parked"' not in journal.read_text()  # not in the step that moved
        await asyncio.sleep(0)  # one event-loop step
        assert json.loads(journal.read_text().splitlines()[-1])["parked"] == parked
        assert store.saved == []  # the snapshot still waits
        assert StateStore(tmp_path).load().parked == parked  # a crash now loses nothing
        await agent.close()  # the save that waited: one, with the record in it
        assert [s.parked for _, s in store.saved] == [parked]

    asyncio.run(asyncio.wait_for(moved(), 10))


def test_moves_made_for_a_grant_are_journaled_in_the_grants_own_write(tmp_path: Path) -> None:
    parked = {"default/b": {"GPU-x": 1024}}

    async def granted() -> None:
        agent = service(StateStore(tmp_path))
        agent.state.preparer.durable = lambda: parked  # type: ignore[method-assign]
        journal = tmp_path / JOURNAL_FILE
        agent.state.persist()  # the residency layer made room for the grant below
        await agent.acquire(tenant("a"), [GPU], timeout=5)
        entries = [json.loads(line) for line in journal.read_text().splitlines()]
        assert [k for e in entries[-2:] for k in e if k != "seq"] == ["parked", "grant"]
        assert entries[-2]["parked"] == parked
        await asyncio.sleep(0)  # the step `persist` asked for: nothing left to write
        assert len(journal.read_text().splitlines()) == len(entries)
        await agent.close()

    asyncio.run(asyncio.wait_for(granted(), 10))


def test_a_tenant_gone_is_journaled_at_once_while_the_snapshot_waits(tmp_path: Path) -> None:
    async def leaving() -> None:
        store = CountingStore(tmp_path)
        agent = service(store)
        await agent.acquire(tenant("a"), [GPU], timeout=5)
        await asyncio.sleep(0)
        store.saved.clear()
        agent.pod_gone("default/a")
        restarted = StateStore(tmp_path).load()  # a crash now
        assert {t.tenant_id for t in restarted.tenants} == {"default/b"}
        assert restarted.leases == []
        assert store.saved == []  # the snapshot still waits
        await agent.close()

    asyncio.run(asyncio.wait_for(leaving(), 10))


def test_a_tenants_process_that_ended_is_journaled_at_once(tmp_path: Path) -> None:
    async def ended() -> None:
        agent = service(StateStore(tmp_path))
        pod = agent.tenants.tenants["default/a"]
        assert agent.tenants.add_pids(pod, [4001, 4002])
        assert not agent.tenants.add_pids(pod, [4001])  # nothing new: nothing to journal
        agent.tenancy.session_closed("default/a", 4001, last=False)
        restarted = StateStore(tmp_path).load()  # a crash now, before any snapshot
        assert {t.tenant_id: sorted(t.pids) for t in restarted.tenants}["default/a"] == [4002]
        revision, lines = agent.tenants.revision, journal_lines(tmp_path)
        assert not agent.tenants.drop_pid("default/a", 4001)  # already gone: nothing changed
        agent.tenancy.session_closed("default/a", 4001, last=False)  # a second close of it
        assert (agent.tenants.revision, journal_lines(tmp_path)) == (revision, lines)
        await agent.close()

    asyncio.run(asyncio.wait_for(ended(), 10))


def test_a_save_still_due_is_written_on_close(tmp_path: Path) -> None:
    async def closing() -> LeaseService:
        agent = service(StateStore(tmp_path))
        held = await agent.acquire(tenant("a"), [GPU], timeout=5)
        agent.yield_(tenant("a"), held.lease.lease_id)
        await agent.acquire(tenant("b"), [GPU], timeout=5)
        await agent.close()  # within SAVE_DELAY_S of the last change
        return agent

    agent = asyncio.run(asyncio.wait_for(closing(), 10))
    saved = StateStore(tmp_path)
    data = saved.path.read_text()
    assert "default/b" in data and "journal_seq" in data  # the snapshot itself, not the journal
    assert agent.metrics.accounting.to_json() == saved.load().accounting


@pytest.mark.parametrize("waiting", [False, True])
def test_a_yield_is_answered_in_the_step_that_ended_the_turn(waiting: bool) -> None:
    """Nothing due in the next step (a timer, a save) goes before the yielder's answer; a
    direct grantee's grant goes before it."""

    async def yielding() -> None:
        agent = service(None)
        held = await agent.acquire(tenant("a"), [GPU], timeout=5)
        grantee = asyncio.create_task(agent.acquire(tenant("b"), [GPU], 5))
        if not waiting:
            grantee.cancel()
        link = Link()
        stream = SessionStream(agent, None, link, lambda: tenant("a"))
        release = pb.Request(request_id=3, release=pb.YieldRequest(lease_id=held.lease.lease_id))
        next_step: list[str] = []
        asyncio.get_running_loop().call_soon(next_step.append, "next step")
        await stream._handle(release)
        assert next_step == []  # answered within the step
        written = link.now + link.later
        assert [m.reply.request_id for m in written] == [3]
        assert written[0].reply.HasField("released")
        if waiting:
            assert (await grantee).lease.tenant_id == "default/b"
        await agent.close()

    asyncio.run(asyncio.wait_for(yielding(), 10))


def test_a_yield_that_starts_no_turn_is_answered_once_its_end_is_on_disk_before_the_rest(
    tmp_path: Path,
) -> None:
    """Nobody waits: the yielder hears as soon as the journal has the end, before the yield's
    event is published; with a waiter, the grant is written first and the answer after."""

    class Link:
        def __init__(self, events: asyncio.Queue[ev.Event], journal: Path) -> None:
            self.events, self.journal = events, journal
            self.seen: list[tuple[int, int, bool]] = []

        async def read(self) -> pb.ClientMessage | None:
            return None

        async def write(self, message: pb.AgentMessage) -> None:
            self.write_now(message)

        def write_now(self, message: pb.AgentMessage) -> bool:
            ended = '"end"' in self.journal.read_text().splitlines()[-1]
            self.seen.append((message.reply.request_id, self.events.qsize(), ended))
            return True

    async def yielding() -> None:
        agent = service(StateStore(tmp_path))
        events = agent.events.attach()
        journal = tmp_path / JOURNAL_FILE
        grants: list[str] = []
        for request_id, waiter in ((1, None), (2, "b")):
            held = await agent.acquire(tenant("a"), [GPU], timeout=5)
            if waiter is not None:
                waiting = asyncio.create_task(
                    agent.acquire(tenant(waiter), [GPU], 5, lambda x: grants.append(x.tenant_id))
                )
                await asyncio.sleep(0)  # b is queued
            while not events.empty():
                events.get_nowait()
            link = Link(events, journal)
            stream = SessionStream(agent, None, link, lambda: tenant("a"))
            lease_id = held.lease.lease_id
            release = pb.Request(request_id=request_id, release=pb.YieldRequest(lease_id=lease_id))
            await stream._handle(release)
            assert [r for r, _, _ in link.seen] == [request_id]
            _, events_before, end_on_disk = link.seen[0]
            if waiter is None:
                assert end_on_disk and events_before == 0  # first, once on disk
            else:
                assert grants == ["default/b"]  # the grant went first
                assert events_before > 0
                granted = await waiting
                agent.yield_(tenant(waiter), granted.lease.lease_id)
        await agent.close()

    asyncio.run(asyncio.wait_for(yielding(), 10))


def journal_lines(state_dir: Path) -> int:
    journal = state_dir / JOURNAL_FILE
    return len(journal.read_text().splitlines()) if journal.exists() else 0

"""A node whose disk refuses the job-turn records (full): every command that must be recorded
before it is answered is refused UNAVAILABLE with one line naming the node and the error, and
the same command sent again is answered once the disk takes it (`agent.server.jobturns`, over
the coordinator's own connection)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.node.jobturn_store import JobTurnStore
from agent.server.jobturns import COMMITTED, JobTurns, NotRecorded
from agent.server.service import LeaseService
from coordinator.agents import AgentLinks, NodeFailed
from tests.agent.server.test_jobturns import TOKEN, node, run
from tests.agent.server.test_jobturns_link import holders, serving

FULL = OSError(28, "No space left on device")


class Disk:
    """Stands between the store and its files: full while `full` is set."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, store: JobTurnStore) -> None:
        self.full = False
        self.refused = 0
        for name in ("save_epoch", "save_turns"):
            monkeypatch.setattr(store, name, self._guard(getattr(store, name)))

    def _guard(self, write: Callable[..., None]) -> Callable[..., None]:
        def guarded(*args: object) -> None:
            if self.full:
                self.refused += 1
                raise FULL
            write(*args)

        return guarded


@asynccontextmanager
async def node_and_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[LeaseService, JobTurns, Disk, Callable[..., Any]]]:
    """A node's job turns served on loopback, its disk, and the coordinator's calls to it by
    name (`call("prepare", epoch, ...)`, the node and address filled in)."""
    async with serving(tmp_path) as (service, turns, address):
        links = AgentLinks(TOKEN)

        def call(kind: str, *args: Any) -> Any:
            return getattr(links, kind)("n1", address, *args)

        try:
            yield service, turns, Disk(monkeypatch, turns._store), call
        finally:
            await links.close()


def no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


def test_a_new_epoch_the_disk_refuses_is_not_obeyed_and_the_call_is_refused_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        async with node_and_disk(tmp_path, monkeypatch) as (service, turns, disk, call):
            await call("report", 1)
            disk.full = True
            with pytest.raises(NodeFailed) as refused:
                await call("prepare", 2, ("t1", "team", "rl", ""), (), 5)
            assert refused.value.code == grpc.StatusCode.UNAVAILABLE
            assert str(refused.value) == (  # as the job's caller reads it
                "node n1: coordinator epoch 2 could not be recorded here ([Errno 28] No space "
                "left on device): commands are refused until it can"
            )
            assert turns.epoch == 1 and not holders(service)  # not obeyed, nothing granted
            # An older leader's command is still refused as stale, not for the disk.
            with pytest.raises(NodeFailed) as stale:
                await call("commit", 0, "t1")
            assert stale.value.code == grpc.StatusCode.FAILED_PRECONDITION
            disk.full = False  # room again: the same prepare goes through
            turn = await call("prepare", 2, ("t1", "team", "rl", ""), (), 5)
            assert list(turn.members) == ["team/sampler", "team/trainer"]
            assert JobTurnStore(tmp_path).load_epoch() == 2

    with caplog.at_level(logging.INFO):
        run(body)
    no_traceback(caplog)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [
        "node n1 could not record coordinator epoch 2 ([Errno 28] No space left on device); "
        "it obeys epoch 1 until it can"
    ]


def test_a_release_the_disk_refuses_ends_the_turn_and_is_answered_once_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        async with node_and_disk(tmp_path, monkeypatch) as (service, turns, disk, call):
            await call("prepare", 1, ("t1", "team", "rl", ""), (), 5)
            disk.full = True
            with pytest.raises(NodeFailed) as refused:  # a commit must be recorded too
                await call("commit", 1, "t1")
            assert refused.value.code == grpc.StatusCode.UNAVAILABLE
            assert "turn t1 started here but could not be recorded" in refused.value.why
            for _ in range(2):  # the coordinator sends a release again until it is heard
                with pytest.raises(NodeFailed) as refused:
                    await call("release", 1, "t1", "yielded")
                assert refused.value.code == grpc.StatusCode.UNAVAILABLE
                assert "turn t1 ended here but could not be recorded" in refused.value.why
                assert not holders(service) and not turns.turns  # ended here all the same
            # The next job's turn cannot be recorded either: refused, nothing of it held.
            with pytest.raises(NodeFailed) as refused:
                await call("prepare", 1, ("t2", "team", "rl", ""), (), 5)
            assert "could not record the turn" in refused.value.why
            assert not holders(service)
            assert [t["turn_id"] for t in JobTurnStore(tmp_path).load_turns()] == ["t1"]
            disk.full = False
            await call("release", 1, "t1", "yielded")  # answered: recorded now
            assert JobTurnStore(tmp_path).load_turns() == []
            assert disk.refused >= 4

    with caplog.at_level(logging.INFO):
        run(body)
    no_traceback(caplog)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    path = tmp_path / "job-turns.json"
    assert errors == [
        f"job turns file {path} could not be written: [Errno 28] No space left on device"
    ]
    assert f"job turns file {path} is written again" in caplog.text


def test_a_member_joining_while_the_disk_is_full_is_kept_and_written_with_the_next_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A change no command waits on (a member joining its turn itself, a revoked member's
    resume) is not refused for the disk: it stands, logged, and the next record writes it."""

    async def body() -> None:
        service, turns = node(tmp_path)
        disk = Disk(monkeypatch, turns._store)
        turn = await turns.prepare(1, "t1", "team", "rl", timeout=5)
        disk.full = True
        turns.mark_joined(turn, "team/trainer", True)  # raises nothing
        assert turn.joined == ["team/trainer"]
        with pytest.raises(NotRecorded, match="turn t1 started here but could not be recorded"):
            turns.commit(1, "t1")
        disk.full = False
        assert turns.commit(1, "t1").state == COMMITTED
        (saved,) = JobTurnStore(tmp_path).load_turns()
        assert (saved["joined"], saved["state"]) == (["team/trainer"], COMMITTED)
        await service.close()

    with caplog.at_level(logging.INFO):
        run(body)
    no_traceback(caplog)


def test_a_new_epoch_refused_again_and_again_is_logged_once_and_once_when_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A new leader asks a node whose disk is full again and again (its recovery, its releases,
    with backoff): the node says so once, not once a call, and once more when it records it."""

    async def body() -> None:
        service, turns = node(tmp_path)
        disk = Disk(monkeypatch, turns._store)
        turns.report(1)
        disk.full = True
        for _ in range(3):
            with pytest.raises(NotRecorded, match="coordinator epoch 2 could not be recorded here"):
                turns.report(2)
        disk.full = False
        turns.report(2)
        assert turns.epoch == 2
        await service.close()

    with caplog.at_level(logging.INFO):
        run(body)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [
        "node n1 could not record coordinator epoch 2 ([Errno 28] No space left on device); "
        "it obeys epoch 1 until it can"
    ]
    assert "node n1 recorded coordinator epoch 2" in caplog.text


def test_the_roll_back_of_a_turn_the_disk_refused_is_answered_while_the_disk_is_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prepare that could not be recorded leaves the node as its disk has it: the coordinator's
    roll-back of that turn is answered at once (nothing to record), not refused UNAVAILABLE and
    sent again and again until the disk frees, once for each turn that failed so."""

    async def body() -> None:
        async with serving(tmp_path) as (service, turns, address):
            disk = Disk(monkeypatch, turns._store)
            links = AgentLinks(TOKEN)
            await links.report("n1", address, 1)
            disk.full = True
            with pytest.raises(NodeFailed, match="could not record the turn"):
                await links.prepare("n1", address, 1, ("t1", "team", "rl", ""), (), 5)
            assert await links.release("n1", address, 1, "t1", "rolled back") is False
            assert not holders(service) and not turns.turns
            await links.close()

    run(body)


def test_a_leader_named_first_while_the_disk_is_full_does_not_keep_its_release_from_ending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The epoch is recorded already, its leader unnamed (an agent upgraded mid-term); the leader
    naming itself while the disk is full is kept in memory, and its release ends the turn."""

    async def body() -> None:
        async with serving(tmp_path) as (service, turns, address):
            unnamed, named = AgentLinks(TOKEN), AgentLinks(TOKEN, holder="coordinator-a")
            try:
                await unnamed.prepare("n1", address, 1, ("t1", "team", "rl", ""), (), 5)
                await unnamed.commit("n1", address, 1, "t1")
                Disk(monkeypatch, turns._store).full = True
                with pytest.raises(NodeFailed) as refused:
                    await named.release("n1", address, 1, "t1", "yielded")
                assert "turn t1 ended here but could not be recorded" in refused.value.why
                assert not holders(service) and not turns.turns
                assert turns._fence.holder == "coordinator-a"  # another of epoch 1: refused
            finally:
                await unnamed.close()
                await named.close()

    run(body)

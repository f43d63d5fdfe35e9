"""What a job's callers hear from the arbiter (`coordinator.turns`): the turn in the step it is
decided, before its commits go out; a caller that gives up leaves the others of the same turn
waiting; a node's failure names the node once (agents on loopback)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from coordinator.agents import NodeFailed
from coordinator.turns import Arbiter
from tests.coordinator.loopback import leading
from tests.coordinator.test_turns import close, cluster, run


def record_commits(monkeypatch: pytest.MonkeyPatch, arbiter: Arbiter, events: list[str]) -> None:
    commit = arbiter.links.commit

    async def recorded(*args: Any) -> Any:
        events.append("commit")
        return await commit(*args)

    monkeypatch.setattr(arbiter.links, "commit", recorded)


def test_the_caller_has_its_turn_before_the_commits_that_record_it_are_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body() -> None:
        async with cluster(tmp_path) as (_, view):
            arbiter = await leading(view)
            events: list[str] = []
            record_commits(monkeypatch, arbiter, events)
            for _ in range(3):
                await arbiter.acquire("team", "rl", "", timeout=5)
                events.append("caller")
                await arbiter.yield_("team", "rl", "")
                await asyncio.sleep(0.01)  # the commits go out meanwhile
            assert events == ["caller", "commit", "commit"] * 3
            await close(arbiter)

    run(body)


def test_a_caller_that_gives_up_leaves_the_others_waiting_for_the_same_turn(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        async with cluster(tmp_path) as (_, view):
            arbiter = await leading(view)
            await arbiter.acquire("team", "sft", "", timeout=5)  # rl waits behind it
            patient = asyncio.create_task(arbiter.acquire("team", "rl", "", timeout=5))
            hasty = asyncio.create_task(arbiter.acquire("team", "rl", "", timeout=5))
            impatient = asyncio.create_task(arbiter.acquire("team", "rl", "", timeout=0.05))
            with pytest.raises(TimeoutError, match="team/sft"):
                await impatient
            hasty.cancel()
            await asyncio.gather(hasty, return_exceptions=True)
            assert not patient.done()
            await arbiter.yield_("team", "sft", "")
            turn = await patient
            assert (turn.job, sorted(turn.nodes)) == ("rl", ["n1", "n2"])
            await arbiter.yield_("team", "rl", "")
            await close(arbiter)

    run(body)


def test_a_node_failure_names_the_node_once() -> None:
    """The agent's own words often name its node ("pod … on node n2: …"); the coordinator leads
    with the node's name only where they do not."""
    named = NodeFailed("n2", "pod team/rl-sampler on node n2: tenant waits")
    assert str(named) == "pod team/rl-sampler on node n2: tenant waits"
    assert str(NodeFailed("n2", "its agent is unreachable")) == "node n2: its agent is unreachable"
    other = NodeFailed("n2", "pod team/a on node n20: tenant waits")  # another node's name
    assert str(other) == "node n2: pod team/a on node n20: tenant waits"

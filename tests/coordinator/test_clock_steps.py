"""The coordinator times job turns on a clock the wall clock's steps (NTP, an operator's `date`)
do not move while it runs, as the agent does (`agent.core.clock`): a step neither charges a job
GPU time it never had nor hands it time back."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from agent.core.leases import LeaseTable
from coordinator import agents
from coordinator.agents import AgentLinks
from coordinator.cluster import Node
from coordinator.daemon import Coordinator, CoordinatorConfig
from coordinator.recovery import recover
from coordinator.status import status_json
from coordinator.turns import Arbiter
from tests.coordinator.loopback import TOKEN, LoopbackNode, leading, view_of


class Clocks:
    """A wall clock and a monotonic clock that a test moves by hand."""

    def __init__(self) -> None:
        self.wall, self.monotonic = 1_700_000_000.0, 5_000.0

    def run(self, seconds: float) -> None:
        self.wall += seconds
        self.monotonic += seconds


@pytest.fixture
def clocks(monkeypatch: pytest.MonkeyPatch) -> Clocks:
    fake = Clocks()
    monkeypatch.setattr(time, "time", lambda: fake.wall)
    monkeypatch.setattr(time, "monotonic", lambda: fake.monotonic)
    return fake


@pytest.mark.parametrize("step", [3600.0, -3600.0])
def test_a_wall_clock_step_during_a_job_turn_is_not_charged_to_the_job(
    clocks: Clocks, step: float
) -> None:
    coordinator = Coordinator(CoordinatorConfig(token="t", queue_policy="fair"), None)
    table = coordinator.arbiter.new_table()
    waiter = table.enqueue("team/rl", ["n1/GPU-0"])
    assert [w.waiter_id for w in table.pick()] == [waiter.waiter_id]
    lease = table.grant(waiter.waiter_id)
    clocks.run(10.0)
    clocks.wall += step  # NTP, or an operator's `date`, while the job holds its turn
    held = coordinator.arbiter.clock() - lease.granted_at
    clocks.run(20.0)
    table.release(lease.lease_id, yielded=True)
    assert held == pytest.approx(10.0)
    assert table.usage["team/rl"].served_seconds == pytest.approx(30.0)
    assert table.fair is not None and table.fair.vtime["team/rl"] == pytest.approx(30.0)


def test_a_new_leader_times_a_turn_it_took_over_on_its_own_clock_not_the_agents(
    tmp_path: Path,
) -> None:
    """The agents' clocks run an hour behind the coordinator's (another machine's, or one a step
    has moved since its agent started): the turn a new leader takes over was granted a moment
    ago, not an hour ago, and the job is charged for that moment at its yield."""

    def agent_clock() -> float:
        return time.time() - 3600.0

    async def body() -> None:
        nodes = [
            await LoopbackNode(name, tmp_path / name, (f"GPU-{name}",), agent_clock).start()
            for name in ("n1", "n2")
        ]
        try:
            view = view_of(nodes, {"rl": [("team/rl-a", "n1", ""), ("team/rl-b", "n2", "")]})
            old = await leading(view, 1)
            await old.acquire("team", "rl", "", timeout=5)
            new = await leading(view, 2)
            turn = new.held["team/rl"]
            assert abs(new.clock() - turn.granted_at) < 60.0
            held = status_json(new, "new", True, new.clock())["held"]["team/rl"]["held_s"]
            assert 0.0 <= held < 60.0
            await new.yield_("team", "rl", "")
            assert new.table.usage["team/rl"].served_seconds < 60.0
            for arbiter in (old, new):
                await arbiter.close()
                await arbiter.links.close()
        finally:
            for node in nodes:
                await node.stop()

    asyncio.run(asyncio.wait_for(body(), 30))


def test_a_turn_taken_over_is_as_old_as_its_agent_said_when_it_answered_not_when_all_had(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new leader asks every agent at once and waits for the slowest (here one that never
    answers, till the call's timeout): a turn's age is read against the leader's clock as its
    agent's answer came, so the wait for the others is not taken off the turn's time held."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # accepts, and answers nothing

    monkeypatch.setattr(agents, "CONNECT_TIMEOUT_S", 1.0)  # (the silent agent's wait, shorter)

    async def body() -> None:
        n1 = await LoopbackNode("n1", tmp_path / "n1", ("GPU-n1",)).start()
        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            view = view_of([n1], {"rl": [("team/rl-a", "n1", "")]})
            old = await leading(view, 1)
            await old.acquire("team", "rl", "", timeout=5)
            granted = old.held["team/rl"].granted_at
            view.nodes["n3"] = Node("n3", f"127.0.0.1:{port}", ("GPU-n3",))
            links = AgentLinks(TOKEN, call_timeout_s=1.0)
            new = Arbiter(view, links, lambda: LeaseTable(clock=time.time), time.time)
            table = new.new_table()
            found = await recover(view, links, table, 2)
            assert "n3" in found.unreachable
            new.lead(2, table, found)
            assert new.held["team/rl"].granted_at == pytest.approx(granted, abs=0.5)
            for arbiter in (old, new):
                await arbiter.close()
                await arbiter.links.close()
        finally:
            server.close()
            await n1.stop()

    asyncio.run(asyncio.wait_for(body(), 30))

"""The coordinator times job turns on a clock the wall clock's steps (NTP, an operator's `date`)
do not move while it runs, as the agent does (`agent.core.clock`): a step neither charges a job
GPU time it never had nor hands it time back."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from coordinator.daemon import Coordinator, CoordinatorConfig
from coordinator.status import status_json
from tests.coordinator.loopback import LoopbackNode, leading, view_of


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

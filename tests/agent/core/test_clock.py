"""The agent's clock: wall time that a step of the wall clock does not move while it runs."""

from __future__ import annotations

import time

import pytest

from agent.core.clock import steady_wall_clock
from tests.harness.agent import AgentRunner


def test_it_reads_the_wall_at_its_making_and_counts_monotonic_time_from_there() -> None:
    wall, mono = [1_000_000.0], [50.0]
    clock = steady_wall_clock(lambda: wall[0], lambda: mono[0])
    assert clock() == 1_000_000.0
    mono[0] += 2.5
    wall[0] += 2.5 + 3600  # an NTP step forward of an hour while it runs
    assert clock() == 1_000_002.5
    wall[0] -= 7200  # and back
    mono[0] += 1.0
    assert clock() == 1_000_003.5
    assert steady_wall_clock(lambda: wall[0], lambda: mono[0])() == wall[0]  # the next start


def test_the_agents_turns_are_timed_on_it(workdir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step of the wall clock while a turn is held moves neither its held time nor the lease
    table's now: `--max-hold` and every deadline count real seconds."""
    real, step = time.time, [0.0]
    monkeypatch.setattr(time, "time", lambda: real() + step[0])  # the wall clock, as it steps
    runner = AgentRunner(workdir).start()
    try:
        service = runner.service
        before = service.state.clock()
        assert abs(before - real()) < 5  # wall time, as the saved grant times are
        step[0] = 3600.0
        assert service.state.clock() - before < 5
        assert service.table._clock() - before < 5
    finally:
        runner.stop()

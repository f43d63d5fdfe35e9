"""The synthetic tenant's loop against a stand-in client and memory on a virtual clock."""

from __future__ import annotations

from agent.client import LeaseInfo
from agent.parking.fakegpu import PatternMismatch
from commands.demo.tenant import Shape, pattern_seed, run_loop


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def pause(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds


class Agent:
    """Grants at once; records who held when."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.turns: list[tuple[float, float]] = []
        self._granted: float | None = None

    def acquire(self, timeout: float | None = None) -> LeaseInfo:
        assert self._granted is None
        self._granted = self.clock()
        return LeaseInfo(f"l{len(self.turns)}", ("g",), {"g": len(self.turns)}, 0.0, 0.0, False)

    def yield_(self) -> None:
        assert self._granted is not None
        self.turns.append((self._granted, self.clock()))
        self._granted = None


class Memory:
    """Keeps the last pattern written; `corrupt_at` flips it before that step's verify."""

    def __init__(self, corrupt_at: int = -1) -> None:
        self.pattern: int | None = None
        self.allocated = False
        self.verifies = 0
        self.corrupt_at = corrupt_at

    def allocate(self, gpu: str, mib: int, memory_limit_mib: int | None = None) -> None:
        self.allocated = True

    def write_pattern(self, gpu: str, seed: int) -> None:
        assert self.allocated
        self.pattern = seed

    def verify_pattern(self, gpu: str, seed: int) -> None:
        self.verifies += 1
        if self.verifies == self.corrupt_at or self.pattern != seed:
            raise PatternMismatch(f"want {seed}, found {self.pattern}")


def test_each_turn_verifies_the_previous_pattern_and_holds_for_its_gpu_phase():
    clock = Clock()
    agent, memory = Agent(clock), Memory()
    shape = Shape(gpu_s=0.3, off_s=0.7, jitter=0.0)
    record = run_loop(
        agent, memory, "g", "t1", 64, shape, clock() + 10, clock=clock, pause=clock.pause
    )
    assert record.steps == 10 and record.verified == 9 and not record.mismatches
    assert memory.pattern == pattern_seed("t1", 9)
    assert all(abs((end - start) - 0.3) < 1e-9 for start, end in agent.turns)
    assert [t[0] for t in record.turns] == [f"l{i}" for i in range(10)]


def test_no_turn_starts_after_the_deadline_and_off_phases_stop_at_it():
    clock = Clock()
    agent = Agent(clock)
    shape = Shape(gpu_s=0.4, off_s=0.6, jitter=0.2, seed=3)
    deadline = clock() + 5
    run_loop(agent, Memory(), "g", "t1", 64, shape, deadline, clock=clock, pause=clock.pause)
    assert all(start < deadline for start, _ in agent.turns)
    assert clock() <= agent.turns[-1][1] + 0.6 * 1.2
    held = [end - start for start, end in agent.turns]
    assert min(held) >= 0.4 * 0.8 - 1e-9 and max(held) <= 0.4 * 1.2 + 1e-9
    assert len(set(held)) > 1  # the jitter varies the phases


def test_a_mismatch_is_recorded_and_the_loop_goes_on():
    clock = Clock()
    memory = Memory(corrupt_at=2)
    shape = Shape(gpu_s=0.1, off_s=0.1, jitter=0.0)
    record = run_loop(
        Agent(clock), memory, "g", "t1", 64, shape, clock() + 0.95, clock=clock, pause=clock.pause
    )
    assert record.steps == 5 and record.verified == 3
    assert record.mismatches == [f"want {pattern_seed('t1', 1)}, found {pattern_seed('t1', 1)}"]

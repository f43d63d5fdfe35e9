"""Several plain rewards run off-turn in a `GRPOTrainer` on a real agent (`app` backend): TRL
calls them one after another, and each used to hand the turn back and take it again, so another
job waiting got the GPU between every two of them and the step took it back (a restore and a
park of its whole memory) only to write one column of rewards; they now hand it back once a
step, together, each logged under its own name."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from tests.examples.trl_jobs import Jobs

needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs trl")


def constant(name: str, value: float, seen: list[str], jobs: Jobs) -> Any:
    """A plain reward scoring every completion `value`; while it runs (off-turn) the other
    job takes the GPU, parking the job if it is not parked yet."""

    def score(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        assert not jobs.callback.holding
        seen.append(name)
        with jobs.other.turn(timeout=30):
            pass
        if value < 0:
            raise ValueError(f"the verifier of {name} failed")
        return [value] * len(completions)

    score.__name__ = score.__qualname__ = name
    return jobs.callback.off_turn(score)


@needs_trl
@pytest.mark.timeout(120)
def test_plain_rewards_run_off_turn_hand_the_turn_back_once_a_step(jobs: Jobs) -> None:
    seen: list[str] = []
    rewards = [constant(f"r{i}", i / 4, seen, jobs) for i in (1, 2, 3)]
    job = jobs.grpo(rewards, steps=2)
    built = len(jobs.callback.turns)
    job.train()
    assert seen == ["r1", "r2", "r3"] * 2
    assert len(jobs.callback.turns) - built == 2 * 2  # each step's, and its return after them
    assert jobs.callback.parker is not None and jobs.callback.parker.stats.parks == 2
    logged = [entry for entry in job.state.log_history if "rewards/r1/mean" in entry]
    assert len(logged) == 2
    for entry in logged:
        assert [entry[f"rewards/r{i}/mean"] for i in (1, 2, 3)] == [0.25, 0.5, 0.75]
    assert not jobs.callback.holding


@needs_trl
@pytest.mark.timeout(120)
def test_an_error_in_one_of_them_leaves_train_holding_no_turn(jobs: Jobs) -> None:
    seen: list[str] = []
    rewards = [constant("r1", 0.25, seen, jobs), constant("bad", -1.0, seen, jobs)]
    rewards.append(constant("r3", 0.75, seen, jobs))
    job = jobs.grpo(rewards, steps=2)
    with pytest.raises(ValueError, match="the verifier of bad failed"):
        job.train()
    assert seen == ["r1", "bad"] and not jobs.callback.holding
    with jobs.other.turn(timeout=30):  # the GPU is free for the other job at once
        pass


def test_a_reward_that_calls_another_runs_it_as_it_is_inside_the_one_hand_back() -> None:
    """Run together, a wrapped reward calling another wrapped one gets its result at once (it
    is off-turn already), and each is still answered its own result: no batch run again."""
    from agent.client.off_turn import OffTurn

    moves: list[str] = []

    def hand_back() -> bool:
        moves.append("handed back")
        return True

    off_turn = OffTurn(hand_back, lambda: moves.append("taken"))

    def inner(x: int) -> int:
        moves.append("inner")
        return x

    def outer(x: int) -> int:
        moves.append("outer")
        return wrapped_inner(x) + 1

    wrapped_inner, wrapped_outer = off_turn.wrap(inner), off_turn.wrap(outer)
    with off_turn.together([wrapped_inner, wrapped_outer]):
        assert (wrapped_inner(5), wrapped_outer(5)) == (5, 6)
    assert moves == ["handed back", "inner", "outer", "inner", "taken"]

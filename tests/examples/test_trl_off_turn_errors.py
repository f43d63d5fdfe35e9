"""A reward run off-turn that raises, on a real agent (`app` backend) where another job takes
the GPU meanwhile: the error leaves `train()` at once, and no turn is taken again for it, also
when other off-turn calls overlapped it."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from tests.examples.trl_jobs import Jobs, OtherHolds, on_the_device

needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs trl")


@needs_trl
@pytest.mark.timeout(120)
def test_an_error_in_a_reward_run_off_turn_leaves_train_without_waiting_for_the_gpu(
    jobs: Jobs,
) -> None:
    """A reward run off-turn raises while the other job holds the GPU: `train()` raises at
    once, holding no turn, instead of waiting for the other job's turn to end (up to the
    agent's --max-hold) and restoring the model only to give the turn back."""
    other = OtherHolds(jobs)

    def verify(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        other.start()
        raise ValueError("the verifier is down")

    job = jobs.grpo([jobs.callback.off_turn(verify)])
    try:
        with pytest.raises(ValueError, match="the verifier is down"):
            job.train()
        assert not other.held_to_the_end.is_set()  # train() raised while the other job held on
        assert not jobs.callback.holding and jobs.callback.baton.lease is None
    finally:
        other.release()
    on_the_device(lambda: job.save_model(str(jobs.workdir / "failed")))  # takes its turn
    assert jobs.callback.parker is not None and jobs.callback.parker.stats.restores == 1


@needs_trl
@pytest.mark.timeout(120)
def test_off_turn_calls_that_overlap_one_that_raised_take_no_turn_as_the_last_ends(
    jobs: Jobs,
) -> None:
    """A reward checks completions on threads, each check run off-turn: one raises while
    another still runs. `train()` raises, and the check that ends after it takes no turn,
    instead of the last check to end taking one for a job whose training is over, holding the
    GPU from the other job until the agent's --max-hold."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    started, finish = threading.Event(), threading.Event()

    def slow(completion: str) -> float:
        started.set()
        assert finish.wait(30), "the test never let the slow check end"
        return 1.0

    def broken(completion: str) -> float:
        raise ValueError("the sandbox crashed")

    check_slowly, check_broken = jobs.callback.off_turn(slow), jobs.callback.off_turn(broken)
    pool = ThreadPoolExecutor(2)

    def reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        pool.submit(check_slowly, completions[0])
        assert started.wait(30), "the slow check never started"
        return [pool.submit(check_broken, c).result() for c in completions]

    job = jobs.grpo([reward])
    try:
        with pytest.raises(ValueError, match="the sandbox crashed"):
            job.train()
    finally:
        finish.set()
        pool.shutdown(wait=True)  # the slow check ended, off-turn, after train() raised
    assert not jobs.callback.holding and jobs.callback.baton.lease is None
    with jobs.other.turn(timeout=10):  # the GPU is the other job's to take at once
        pass

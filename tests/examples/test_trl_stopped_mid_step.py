"""A training loop left between a step's `on_step_begin` and its `on_step_end` (with gradient
accumulation, a callback that sets `should_training_stop` at `on_step_begin` or
`should_epoch_stop` at `on_substep_end`): the step never ends, and its turn is given back all
the same, at the epoch's end or training's, while another job waits for the GPU."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from tests.examples.trl_jobs import Jobs, on_the_device

needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs trl")


def stopper(event: str, flag: str) -> Any:
    """A user's callback that sets `control.<flag>` at `event` once a step was taken."""
    from transformers import TrainerCallback

    class Stop(TrainerCallback):
        pass

    def stop(self: Any, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if state.global_step >= 1:
            setattr(control, flag, True)

    setattr(Stop, event, stop)
    return Stop()


@needs_trl
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("event", "flag"),
    [("on_step_begin", "should_training_stop"), ("on_substep_end", "should_epoch_stop")],
)
def test_a_step_the_loop_leaves_gives_its_turn_back(jobs: Jobs, event: str, flag: str) -> None:
    from agent.examples.trl_train.jobs import TrlConfig, trainer

    config = TrlConfig(kind="sft", seed=6, batch=4, accumulation=2)
    callback = jobs.callback
    with callback.turn():
        job = trainer(config, 3, jobs.workdir, [callback, stopper(event, flag)], callback.off_turn)
        callback.watch(job)
    on_the_device(job.train)
    assert job.state.global_step == 1
    assert not callback.holding  # it held the step's turn after train() returned
    jobs.parked_by_the_other_job()  # the other job's turn comes at once, not at --max-hold
    assert all(t[3] for t in callback.turns)

"""A dict of eval datasets (`eval_dataset={"a": ..., "b": ...}`): transformers evaluates each
dataset in turn and fires `on_evaluate` after each, but the evaluation is one piece of the
step's device work: every dataset is evaluated inside the step's turn, and the step hands the
turn over once, watched (`watch(trainer)`) or not (the callback only in `callbacks=[...]`)."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from tests.examples.trl_jobs import Jobs

needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs trl")


@needs_trl
@pytest.mark.timeout(180)
@pytest.mark.parametrize("watched", [True, False], ids=["watched", "unwired"])
def test_every_eval_dataset_is_evaluated_in_the_steps_one_turn(jobs: Jobs, watched: bool) -> None:
    from transformers import TrainerCallback

    from agent.examples.trl_train.jobs import TrlConfig, trainer

    callback = jobs.callback
    batches: list[tuple[int, bool]] = []

    class Probe(TrainerCallback):  # fires after each evaluation batch's forward pass
        def on_prediction_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            batches.append((state.global_step, callback.holding))

    config = TrlConfig(kind="sft", seed=6, batch=4, eval_steps=2)
    with callback.turn():
        job = trainer(config, 4, jobs.workdir, [callback, Probe()], callback.off_turn)
        job.eval_dataset = {name: job.eval_dataset for name in ("a", "b", "c")}
        if watched:
            callback.watch(job)
    before = len(callback.turns)
    job.train()
    assert batches == [(step, True) for step in (2, 4) for _ in range(6)]  # 3 datasets x 2
    assert len(callback.turns) - before == 4  # one turn per step: no handover per dataset
    assert not callback.holding

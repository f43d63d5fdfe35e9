"""Training of several short epochs (a small dataset, `num_train_epochs`): a watched trainer's
epoch's end takes a turn for its callbacks, but the epoch's last step keeps its turn for it
rather than handing the GPU over and asking for it again at once (a park and a restore, when
another job waits, for no step): one turn per optimizer step."""

from __future__ import annotations

import importlib.util

import pytest

from tests.examples.trl_jobs import Jobs

needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs trl")


@needs_trl
@pytest.mark.timeout(180)
@pytest.mark.parametrize("accumulation", [1, 3])
def test_an_epochs_end_takes_no_turn_of_its_own(jobs: Jobs, accumulation: int) -> None:
    from agent.examples.trl_train.jobs import TrlConfig, trainer

    callback = jobs.callback
    config = TrlConfig(kind="sft", seed=6, batch=4, accumulation=accumulation)
    with callback.turn():
        job = trainer(config, 0, jobs.workdir, [callback], callback.off_turn)
        job.train_dataset = job.train_dataset.select(range(8))  # 2 batches an epoch
        job.args.max_steps, job.args.num_train_epochs = -1, 3
        callback.watch(job)
    before = len(callback.turns)
    job.train()
    steps = job.state.global_step
    assert steps == (6 if accumulation == 1 else 3)  # the last micro-batches make a step
    assert len(callback.turns) - before == steps
    assert not callback.holding

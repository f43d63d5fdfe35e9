"""A trainer watched but not given the callback (`baton.watch(trainer)` on a trainer built
elsewhere, without `callbacks=[baton]`): its turns are taken around its events all the same, and
what `train()` builds, the optimizer, is parked with the model, not left on the device while the
agent counts the job parked."""

from __future__ import annotations

import importlib.util

import pytest

from tests.examples.trl_jobs import Jobs, on_the_device

needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs trl")


@needs_trl
@pytest.mark.timeout(180)
def test_a_trainer_watched_without_the_callback_parks_its_optimizer(jobs: Jobs) -> None:
    from agent.client.torch import ParkError
    from agent.examples.trl_train.jobs import TrlConfig, trainer

    callback = jobs.callback
    with callback.turn():
        job = trainer(TrlConfig(kind="sft", seed=6, batch=4), 2, jobs.workdir, [], None)
        callback.watch(job)
    assert callback not in job.callback_handler.callbacks
    on_the_device(job.train)
    assert len(callback.turns) == 1 + 2 and not callback.holding
    jobs.parked_by_the_other_job()

    moments = [t for state in job.optimizer.state.values() for t in state.values()]
    assert moments
    for moment in moments:  # Adam's state: twice the weights' bytes
        with pytest.raises(ParkError, match="is parked"):
            moment.sum()
    with callback.turn():
        assert all(moment.isfinite().all() for moment in moments)

"""`BatonCallback.close()` of a parked job whose last turn does not come (a Ctrl-C while the other
job holds the GPU, or the callback's `acquire_timeout`): it raises and leaves the job as it was,
still a tenant, so its trainer's `save_model()` takes a turn and a second `close()` brings the
models back, instead of the models left parked for good."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from tests.examples.trl_jobs import Jobs, OtherHolds, on_the_device

needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs trl")


@needs_trl
@pytest.mark.timeout(180)
@pytest.mark.parametrize("cut", ["ctrl-c", "timeout"])
def test_a_close_whose_last_turn_does_not_come_can_be_made_again(jobs: Jobs, cut: str) -> None:
    from agent.client.errors import AcquireTimeout

    callback, baton = jobs.callback, jobs.callback.baton
    job = jobs.built(1)
    job.train()
    other = OtherHolds(jobs)
    other.start()
    acquire = baton.acquire

    def interrupted(timeout: float | None = None) -> Any:
        baton.acquire = acquire  # once: as a Ctrl-C while the other job holds the GPU
        raise KeyboardInterrupt

    if cut == "ctrl-c":
        baton.acquire = interrupted
    else:
        callback.acquire_timeout = 0.5
    try:
        with pytest.raises(KeyboardInterrupt if cut == "ctrl-c" else AcquireTimeout):
            callback.close()
    finally:
        other.release()
    assert callback.parker is not None and callback.parker.parked
    callback.acquire_timeout = 30

    on_the_device(lambda: job.save_model(str(jobs.workdir / "saved")))
    callback.close()

    assert not callback.parker.parked
    assert set(jobs.agent.status()["tenants"]) == {"local/other"}
    assert "eval_loss" in on_the_device(job.evaluate)

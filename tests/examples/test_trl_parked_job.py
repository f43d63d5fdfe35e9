"""A TRL job that another job parked between its turns, on a real agent (`app` backend): what
the watched trainer does on the device outside its steps (`evaluate()`, `save_model()`, and
`train()`'s set-up, which loads a checkpoint it resumes from before `on_train_begin`) takes a
turn, so it runs on memory restored, not on storages a park freed."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs trl")

T = TypeVar("T")


@needs_trl
@pytest.mark.timeout(180)
def test_a_parked_job_evaluates_saves_and_resumes_from_its_checkpoint(
    tmp_path: Path, workdir: str
) -> None:
    import torch

    from agent.client import Baton
    from agent.client.torch import TorchParker
    from agent.client.trl import BatonCallback
    from agent.examples.trl_train.jobs import TrlConfig, deterministic, trainer
    from agent.parking.setup import ParkingOptions
    from baton.contract.names import fake_gpu_uuid
    from tests.harness.agent import AgentRunner

    deterministic()
    # One simulated 100 MiB GPU: two jobs of 60 MiB cannot both be resident.
    parking = ParkingOptions(backend="app", fake_gpus="1x100", simulated_inventory=True)
    with AgentRunner(workdir, parking=parking) as agent:
        gpu = fake_gpu_uuid(0)
        callback = BatonCallback(Baton(agent.socket, [gpu], name="job", gpu_memory_mib=60))
        weights = TorchParker(torch.zeros(1024))  # the other job's, parked in its turn
        other = Baton(
            agent.socket, [gpu], name="other", gpu_memory_mib=60,
            on_park=weights.park, on_restore=weights.restore,
        )  # fmt: skip
        assert callback.parker is not None
        config = TrlConfig(kind="sft", seed=6, batch=4, save_steps=2, eval_steps=2)

        def built(steps: int) -> Any:
            with callback.turn():
                job = trainer(config, steps, tmp_path, [callback], callback.off_turn)
                callback.watch(job)
            return job

        def parked_by_the_other_job() -> None:
            with other.turn(timeout=30):
                pass
            assert callback.parker is not None and callback.parker.parked

        def on_the_device(call: Callable[[], T]) -> T:
            """`call()`; a failure on freed storages fails the test with its message alone (a
            traceback's repr of a parked parameter would crash the interpreter)."""
            try:
                return call()
            except RuntimeError as exc:
                pytest.fail(f"ran on the memory a park freed: {exc}", pytrace=False)

        try:
            built(2).train()  # writes checkpoint-2
            job = built(4)
            parked_by_the_other_job()
            assert "eval_loss" in on_the_device(job.evaluate)
            parked_by_the_other_job()
            on_the_device(lambda: job.save_model(str(tmp_path / "saved")))
            parked_by_the_other_job()
            on_the_device(lambda: job.train(resume_from_checkpoint=True))  # loads checkpoint-2
            assert job.state.global_step == 4 and not callback.holding
            assert callback.parker.stats.restores >= 3
        finally:
            callback.close()
            other.close()

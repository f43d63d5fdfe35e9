"""A TRL job and another job that parks it, on one real agent (`app` backend): the `jobs`
fixture (tests/examples/conftest.py) of the tests of a parked TRL job."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


@dataclass
class Jobs:
    """A TRL job's callback and another job that parks it, on one agent."""

    agent: Any
    callback: Any
    other: Any
    workdir: Path

    def built(self, steps: int) -> Any:
        """A watched SFT trainer of `steps` steps, built inside a turn."""
        from agent.examples.trl_train.jobs import TrlConfig, trainer

        config = TrlConfig(kind="sft", seed=6, batch=4, save_steps=2, eval_steps=2)
        with self.callback.turn():
            job = trainer(config, steps, self.workdir, [self.callback], self.callback.off_turn)
            self.callback.watch(job)
        return job

    def grpo(self, rewards: list[Any], steps: int = 2) -> Any:
        """A watched GRPO trainer of `steps` steps scoring with `rewards`, built in a turn."""
        from trl import GRPOConfig, GRPOTrainer

        from agent.examples.trl_train.jobs import TrlConfig, dataset, model, tokenizer

        config = TrlConfig(kind="grpo", seed=7, batch=4, group=4, beta=0.0)
        args = GRPOConfig(
            output_dir=str(self.workdir / "out"), max_steps=steps, per_device_train_batch_size=4,
            num_generations=4, max_completion_length=5, beta=0.0, use_cpu=True,
            report_to="none", save_strategy="no", disable_tqdm=True, logging_steps=1,
        )  # fmt: skip
        with self.callback.turn():
            job = GRPOTrainer(
                model=model(config, self.workdir), reward_funcs=rewards, args=args,
                train_dataset=dataset(config, 16), processing_class=tokenizer(),
                callbacks=[self.callback],
            )  # fmt: skip
            self.callback.watch(job)
        return job

    def parked_by_the_other_job(self) -> None:
        with self.other.turn(timeout=30):
            pass
        assert self.callback.parker is not None and self.callback.parker.parked


@contextlib.contextmanager
def running_jobs(tmp_path: Path, workdir: str) -> Iterator[Jobs]:
    """The job and the other job, on one simulated GPU too small for both, closed after."""
    import torch

    from agent.client import Baton
    from agent.client.torch import TorchParker
    from agent.client.trl import BatonCallback
    from agent.examples.trl_train.jobs import deterministic
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
        try:
            yield Jobs(agent, callback, other, tmp_path)
        finally:
            callback.close()
            other.close()


def on_the_device(call: Callable[[], T]) -> T:
    """`call()`; a failure on freed storages fails the test with its message alone (a
    traceback's repr of a parked parameter would crash the interpreter)."""
    try:
        return call()
    except RuntimeError as exc:
        pytest.fail(f"ran on the memory a park freed: {exc}", pytrace=False)


class OtherHolds:
    """The other job takes the GPU from a thread (`start`, in a reward run off-turn) and holds
    it until `release`; `held_to_the_end` says it held for the whole 20 s (no one left early)."""

    def __init__(self, jobs: Jobs) -> None:
        self.taken, self.released = threading.Event(), threading.Event()
        self.held_to_the_end = threading.Event()
        self._thread = threading.Thread(target=self._hold, args=(jobs,))

    def _hold(self, jobs: Jobs) -> None:
        with jobs.other.turn(timeout=30):
            self.taken.set()
            if not self.released.wait(20):
                self.held_to_the_end.set()

    def start(self) -> None:
        """Take the GPU now; returns once the other job holds it."""
        self._thread.start()
        assert self.taken.wait(30), "the other job got no turn"

    def release(self) -> None:
        """Let the other job yield, and wait for it to."""
        self.released.set()
        self._thread.join(timeout=30)

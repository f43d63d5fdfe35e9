"""`BatonCallback` inside a real GRPOTrainer: every forward pass (generation, reference and old
log-probs, the loss) and every optimizer step run inside a turn; the wrapped reward outside."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs trl")


class Recorder:
    """Stands in for `Baton`: records acquires and yields."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def register_callbacks(self, *_: Any) -> None:
        pass

    def acquire(self, timeout: float | None = None) -> Any:
        self.events.append("acquire")
        return type("Lease", (), {"lease_id": str(len(self.events))})()

    def yield_(self) -> None:
        self.events.append("yield")

    def close(self) -> None:
        pass


@needs_trl
@pytest.mark.timeout(120)
def test_every_device_phase_of_a_grpo_step_is_inside_a_turn(tmp_path: Path) -> None:
    from torch.optim.optimizer import register_optimizer_step_pre_hook
    from transformers import TrainerCallback

    from agent.client.trl import BatonCallback
    from agent.examples.trl_train.jobs import TrlConfig, deterministic, trainer

    deterministic()
    baton = Recorder()
    callback = BatonCallback(baton)  # type: ignore[arg-type]
    outside: list[str] = []
    rewards: list[bool] = []

    class Probe(TrainerCallback):  # runs before BatonCallback: the step's logging reads the loss
        def on_log(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if not callback.holding and "train_loss" not in kw["logs"]:
                outside.append("log")

    def wrap(fn: Any) -> Any:
        def reward(*a: Any, **k: Any) -> Any:
            rewards.append(callback.holding)
            return fn(*a, **k)

        return callback.off_turn(reward)

    config = TrlConfig(kind="grpo", seed=3, batch=4, group=4, accumulation=2, iterations=2)
    with callback.turn():
        job = trainer(config, 3, tmp_path, [Probe(), callback], wrap)
        callback.watch(job)
    for module in (job.model, job.ref_model):
        module.register_forward_pre_hook(
            lambda m, a: None if callback.holding else outside.append("forward")
        )
    hook = register_optimizer_step_pre_hook(
        lambda o, a, k: None if callback.holding else outside.append("step")
    )
    try:
        job.train()
    finally:
        hook.remove()
    assert outside == [] and not callback.holding
    assert rewards and not any(rewards)  # the wrapped reward saw no turn held
    assert baton.events.count("acquire") == baton.events.count("yield") >= 4
    assert callback.parker is not None and callback.parker.stats.copied_bytes > 0
    assert all(t[2] <= t[3] for t in callback.turns)

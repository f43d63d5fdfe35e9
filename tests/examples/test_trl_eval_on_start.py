"""`eval_on_start=True`: the evaluation `train()` runs before its first step logs its metrics and
then fires `on_evaluate`; a callback of that event (one that generates samples from the model, say)
runs inside the turn, not after the turn ended at the evaluation's log."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from tests.examples.test_trl_callback import recorded, watched

needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs trl")


@needs_trl
@pytest.mark.timeout(120)
def test_the_callbacks_of_an_evaluation_on_start_run_inside_the_turn(tmp_path: Path) -> None:
    from transformers import TrainerCallback

    from agent.examples.trl_train.jobs import TrlConfig

    baton, callback = recorded()
    seen: list[tuple[int, bool]] = []

    class Samples(TrainerCallback):  # listed after Baton's: it reads the model at each evaluation
        def on_evaluate(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            seen.append((state.global_step, callback.holding))

    config = TrlConfig(kind="sft", seed=5, batch=4, eval_steps=2)
    job = watched(callback, config, 2, tmp_path, [callback, Samples()], callback.off_turn)
    job.args.eval_on_start = True
    job.train()
    assert seen == [(0, True), (2, True)]
    assert not callback.holding
    assert baton.events.count("acquire") == baton.events.count("yield")

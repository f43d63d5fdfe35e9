"""The TRL demo tenant's turn check: parameters changed between two turns are reported, and
parameters left alone are not (what `baton demo --tenant-kind trl` calls verified turns)."""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("trl") is None:
    pytest.skip("needs trl (pip install 'baton-gpu[trl]')", allow_module_level=True)

import torch

from agent.examples.train.tenant import Report
from agent.examples.trl_train.tenant import SoloBaton, checked_callback


def test_a_change_between_turns_is_a_mismatch_and_an_untouched_model_is_not() -> None:
    report = Report()
    model = torch.nn.Linear(4, 4)
    callback = checked_callback(SoloBaton(), report, acquire_timeout=1.0)
    callback.watch(model)
    with callback.turn():
        pass
    with callback.turn():  # nothing touched the parameters between the two turns
        pass
    assert callback.ok and report.mismatches == []
    with torch.no_grad():
        model.weight[0, 0] += 1.0  # as a broken park or restore would
    with callback.turn():
        pass
    assert not callback.ok and report.mismatches == ["turn 3: parameters changed"]


@pytest.mark.timeout(120)
def test_sfts_modelled_batch_wait_runs_outside_the_turn(tmp_path, monkeypatch) -> None:
    from agent.client.trl import BatonCallback
    from agent.examples.trl_train import jobs

    waits: list[bool] = []
    real_sleep = jobs.time.sleep
    callback = BatonCallback(SoloBaton())  # type: ignore[arg-type]

    def sleep(seconds: float) -> None:
        if seconds == 0.0123:  # the modelled wait; anything else sleeps as asked
            waits.append(callback.holding)
            return
        real_sleep(seconds)

    monkeypatch.setattr(jobs.time, "sleep", sleep)
    jobs.deterministic()
    config = jobs.TrlConfig(kind="sft", seed=3, batch=4, off_s=0.0123)
    with callback.turn():
        job = jobs.trainer(config, 3, tmp_path, [callback], callback.off_turn)
        callback.watch(job)
    job.train()
    assert len(waits) >= 3 and not any(waits)  # a batch per step, none while a turn was held
    assert len(callback.turns) >= 1 + 3 and not callback.holding

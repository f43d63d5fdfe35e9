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

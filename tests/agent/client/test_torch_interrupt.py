"""A Ctrl-C while TorchParker frees the storages it copied out: the park is finished and
recorded before the interrupt is raised, so its bytes come back with the restore (it cut the
park in two, some storages freed and none recorded: the weights were lost)."""

from __future__ import annotations

import importlib.util
import os
import signal
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")


def test_a_ctrl_c_as_the_park_frees_its_storages_loses_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    import agent.client.torch as parking
    from agent.client.torch import TorchParker

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    parker = TorchParker(model)
    guard = parking.guard

    def interrupted(tensors: Any) -> Any:  # a Ctrl-C lands as the storages are freed
        os.kill(os.getpid(), signal.SIGINT)
        return guard(tensors)

    monkeypatch.setattr(parking, "guard", interrupted)
    # Python's own Ctrl-C handler, whatever this process was started with (a shell's background
    # job starts with SIGINT ignored: Python keeps that, and nothing would be raised)
    started_with = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            parker.park("gpu")
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    finally:
        signal.signal(signal.SIGINT, started_with)
    monkeypatch.setattr(parking, "guard", guard)
    assert all(p.untyped_storage().nbytes() == 0 for p in model.parameters())
    assert parker.restore("gpu") == sum(v.numel() * v.element_size() for v in before.values())
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())

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


def test_a_ctrl_c_as_the_restore_ends_leaves_it_to_be_run_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A restore a grant owes runs on the thread that asked for the turn: a Ctrl-C there gives
    the turn back with the GPU still parked, and the next acquire restores again. One landing
    as the restore gave the tensors their classes back left it unable to run again (`ValueError`
    from a zip: its byte views were dropped before it was done), the tensors parked for good."""
    import torch

    import agent.client.torch as parking
    from agent.client.torch import TorchParker

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    parker = TorchParker(model)
    moved = parker.park("gpu")
    unguard = parking.unguard

    def interrupted(guarded: Any) -> None:  # a Ctrl-C lands as the classes are given back
        os.kill(os.getpid(), signal.SIGINT)
        unguard(guarded)

    monkeypatch.setattr(parking, "unguard", interrupted)
    started_with = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            parker.restore("gpu")
    finally:
        signal.signal(signal.SIGINT, started_with)
    monkeypatch.setattr(parking, "unguard", unguard)
    assert parker.parked  # the agent and the client still count it parked
    assert parker.restore("gpu") == moved
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())
    assert parker.park("gpu") == moved and parker.restore("gpu") == moved

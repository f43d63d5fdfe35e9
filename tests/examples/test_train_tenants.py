"""Real training tenants: the PyTorch park helper, and bit-exact training while taking turns."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")


def test_the_client_imports_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import agent.client\n"
        "try:\n    import agent.client.torch\nexcept ImportError:\n    print('no torch')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "no torch"


@needs_torch
def test_park_moves_every_storage_out_and_back_through_reused_buffers() -> None:
    import torch

    from agent.client.torch import ParkError, TorchParker

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 16)).sum().backward()
    optimizer.step()
    cache = torch.arange(32.0)
    assert model.weight.grad is not None and model.bias.grad is not None
    tensors = [model.weight, model.bias, model.weight.grad, model.bias.grad, cache]
    tensors += [v for state in optimizer.state.values() for v in state.values()]
    before = [t.clone() for t in tensors]
    parker = TorchParker(model, optimizer, lambda: [cache])
    footprint = parker.footprint_bytes()
    assert footprint == sum(t.numel() * t.element_size() for t in tensors)

    assert parker.park("gpu") == footprint
    assert all(t.untyped_storage().nbytes() == 0 for t in tensors)
    with pytest.raises(ParkError, match="already parked"):
        parker.park("gpu")
    buffers = [b.data_ptr() for b in parker._host]
    assert parker.restore("gpu") == footprint
    assert all(torch.equal(a, b) for a, b in zip(before, tensors, strict=True))
    parker.park("gpu")
    assert [b.data_ptr() for b in parker._host] == buffers  # allocated once, reused
    parker.restore("gpu")
    with pytest.raises(ParkError, match="not parked"):
        parker.restore("gpu")
    assert (parker.stats.parks, parker.stats.restores) == (2, 2)
    assert all(torch.equal(a, b) for a, b in zip(before, tensors, strict=True))


@needs_torch
def test_a_park_asked_during_a_turn_waits_for_its_work() -> None:
    import torch

    from agent.client.torch import ParkError, TorchParker

    weights = torch.ones(1024)
    parker = TorchParker(weights)
    with parker.in_use():
        park = threading.Thread(target=parker.park, args=("gpu",))
        park.start()
        park.join(0.2)
        assert park.is_alive() and weights.untyped_storage().nbytes() == 4096
        weights.mul_(2)
    park.join(10)
    assert parker.parked
    with pytest.raises(ParkError, match="parked"), parker.in_use():
        pass
    parker.restore("gpu")
    assert torch.equal(weights, torch.full((1024,), 2.0))


def specs() -> list:
    from agent.examples.train.jobs import JobConfig
    from baton.demo.train import TenantSpec

    return [
        TenantSpec("sft", JobConfig(kind="sft", seed=1, batch=16), steps=8),
        TenantSpec("grpo", JobConfig(kind="grpo", seed=2, batch=4, group=4), steps=5),
    ]


@needs_torch
@pytest.mark.timeout(180)
def test_tenants_sharing_a_gpu_train_bit_for_bit_as_they_do_alone() -> None:
    from baton.demo.train import run_alone, run_shared, same_training

    tenants = specs()
    alone = asyncio.run(run_alone(tenants, agent=False))
    shared = asyncio.run(run_shared(tenants))
    assert all(r["moves"]["parks"] == 0 for r in alone)
    for spec, a, s in zip(tenants, alone, shared.reports, strict=True):
        assert s["steps"] == spec.steps and not s["mismatches"]
        assert same_training(a, s) == []
        # The GPU holds one of them at a time: each was parked and restored between its turns.
        assert s["moves"]["parks"] >= 2 and s["moves"]["restores"] >= 2
        assert s["verified"] == spec.steps - 1
    assert len(alone[1]["rewards"]) == 5 and len(set(alone[0]["losses"])) > 1
    counted = shared.moves["park"]
    reported = sum(r["moves"]["parked_bytes"] for r in shared.reports)
    # The agent counts the bytes the callbacks report (and may park once more after "done").
    assert counted["count"] >= 4 and counted["bytes"] >= reported > 0

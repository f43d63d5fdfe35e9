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
    assert parker._layout is not None
    buffers = [b.data_ptr() for b in parker._layout.host]
    assert parker.restore("gpu") == footprint
    assert all(torch.equal(a, b) for a, b in zip(before, tensors, strict=True))
    parker.park("gpu")
    assert [b.data_ptr() for b in parker._layout.host] == buffers  # allocated once, reused
    parker.restore("gpu")
    with pytest.raises(ParkError, match="not parked"):
        parker.restore("gpu")
    assert (parker.stats.parks, parker.stats.restores) == (2, 2)
    assert all(torch.equal(a, b) for a, b in zip(before, tensors, strict=True))


@needs_torch
def test_a_park_after_the_tensors_changed_moves_the_ones_there_now() -> None:
    import torch

    from agent.client.torch import TorchParker

    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    parker = TorchParker(model, optimizer)
    parker.park("gpu")
    parker.restore("gpu")
    model(torch.randn(2, 8)).sum().backward()
    optimizer.step()  # gradients and momentum buffers appear: new storages
    assert model.weight.grad is not None and model.bias.grad is not None
    tensors = [model.weight, model.bias, model.weight.grad, model.bias.grad]
    tensors += [v for state in optimizer.state.values() for v in state.values()]
    before = [t.clone() for t in tensors]
    assert parker.park("gpu") == sum(t.numel() * t.element_size() for t in tensors)
    assert all(t.untyped_storage().nbytes() == 0 for t in tensors)
    parker.restore("gpu")
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
    from commands.demo.train import TenantSpec

    return [
        TenantSpec("sft", JobConfig(kind="sft", seed=1, batch=16), steps=8),
        TenantSpec("grpo", JobConfig(kind="grpo", seed=2, batch=4, group=4), steps=5),
    ]


@needs_torch
@pytest.mark.timeout(180)
def test_tenants_sharing_a_gpu_train_bit_for_bit_as_they_do_alone() -> None:
    from commands.demo.train import run_alone, run_shared, same_training

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


@needs_torch
def test_bench_train_efficiency_counts_steps_not_time_held() -> None:
    """Both jobs keep their alone pace while sharing, but their turns stretch by half (contended
    cores): the time held reads 1.3 of the ideal, the training done 1.0."""
    from commands.bench.train import summarize
    from commands.demo.train import Outcome

    alone = [_report(n, [[4 * i, 4 * i, 4 * i + 1] for i in range(5)]) for n in ("sft", "grpo")]
    shared = [
        _report("sft", [[4 * i, 4 * i, 4 * i + 1.5] for i in range(5)]),
        _report("grpo", [[4 * i + 2, 4 * i + 2, 4 * i + 3.5] for i in range(5)]),
    ]
    moves = {d: {"count": 2.0, "bytes": 2000.0, "seconds": 0.0} for d in ("park", "restore")}
    figures = summarize(specs(), alone, Outcome(shared, moves, 1), copy=5.0)
    assert figures["ideal_duty"] == round(2 * 5 / 17, 4)
    assert figures["efficiency"] == 1.0 and figures["turn_efficiency"] > 1.2
    assert figures["turn_stretch"] == 1.5


def _report(name: str, turns: list[list[float]], sha: str = "x") -> dict:
    moves = {"parks": 1, "restores": 1, "parked_bytes": 1000, "restored_bytes": 1000}
    return {
        "name": name, "steps": len(turns), "losses": [1.0] * len(turns), "rewards": [],
        "params_sha256": sha, "turns": [["l", t[0], t[1], t[2]] for t in turns],
        "step_ends": [t[2] for t in turns], "footprint_bytes": 1000,
        "moves": {**moves, "park_s": 1e-6, "restore_s": 2e-6},
    }  # fmt: skip


@needs_torch
def test_bench_train_figures_from_turn_records() -> None:
    from commands.bench.train import summarize
    from commands.demo.train import Outcome

    tenants = specs()
    # Alone: each holds 1 s of every 4. Shared: both run from 1.5 s (grpo's first grant) to
    # 5 s (its last yield), the device busy 3 s of those 3.5; grpo waited 0.5 s on a free one.
    alone = [
        _report("sft", [[0, 0, 1], [4, 4, 5], [8, 8, 9]]),
        _report("grpo", [[0, 0, 1], [4, 4, 5], [8, 8, 9]]),
    ]
    shared = [
        _report("sft", [[0, 0, 1], [3, 3, 4], [6, 6, 7]]),
        _report("grpo", [[0.5, 1.5, 2.5], [4, 4, 5]], sha="y"),
    ]
    moves = {d: {"count": 2.0, "bytes": 2000.0, "seconds": 0.0} for d in ("park", "restore")}
    figures = summarize(tenants, alone, Outcome(shared, moves, 3), copy=5.0)
    assert figures["baseline_duty"] == round(3 / 9, 4)
    assert figures["ideal_duty"] == round(6 / 9, 4)
    assert (figures["timesliced_duty"], figures["idle_while_waited_s"]) == (0.8571, 0.5)
    assert figures["turn_efficiency"] == round((3 / 3.5) / (6 / 9), 4)
    # Training done: in the window sft finished one step (no pace), grpo 1 step in 2.5 s where
    # alone it did 2 in 8 (1.6 x its pace): (1/3 * 0 + 1/3 * 1.6) of an ideal 2/3.
    assert figures["achieved_duty"] == round(1.6 / 3, 4)
    assert figures["efficiency"] == 0.8
    assert figures["park_gbps"] == 1.0 and figures["restore_gbps"] == 0.5
    assert figures["copy_gbps"] == 5.0 and figures["tenants"] == 2
    assert figures["identical"] is False
    assert figures["differences"] == [
        f"grpo: {k} differ" for k in ("steps", "losses", "params_sha256")
    ]
    assert set(figures["steps_per_s"]) == {"sft", "grpo"}


@needs_torch
def test_bench_train_reference_is_the_mean_of_the_runs_alone_around_the_shared_one() -> None:
    """The machine slowed between the runs alone (a step every 4 s before, every 6 s after):
    each job's reference pace is the mean of the two, and a run alone that trained otherwise
    than the shared one is a difference too."""
    from commands.bench.train import summarize
    from commands.demo.train import Outcome

    before = [_report(n, [[4 * i, 4 * i, 4 * i + 1] for i in range(5)]) for n in ("sft", "grpo")]
    after = [
        _report("sft", [[6 * i, 6 * i, 6 * i + 1] for i in range(5)]),
        _report("grpo", [[6 * i, 6 * i, 6 * i + 1] for i in range(5)], sha="z"),
    ]
    # Shared: each a step every 5 s, the mean of its two paces alone (1/4 and 1/6 step/s).
    shared = [
        _report("sft", [[5 * i, 5 * i, 5 * i + 1] for i in range(5)]),
        _report("grpo", [[5 * i + 1, 5 * i + 1, 5 * i + 2] for i in range(5)]),
    ]
    moves = {d: {"count": 2.0, "bytes": 2000.0, "seconds": 0.0} for d in ("park", "restore")}
    figures = summarize(specs(), before, Outcome(shared, moves, 1), copy=5.0, alone_after=after)
    sft = figures["per_tenant"][0]
    assert sft["steps_per_s_alone_runs"] == [0.25, round(1 / 6, 3)]
    assert sft["steps_per_s_alone"] == round((0.25 + 1 / 6) / 2, 3)
    # Duty alone: 5 of 17 s before, 5 of 25 s after; the ideal is their means' sum.
    assert figures["ideal_duty"] == round(5 / 17 + 5 / 25, 4)
    assert figures["baseline_duty"] == round((5 / 17 + 5 / 25) / 2, 4)
    # 0.2 step/s shared against a reference of 5/24: 0.96 of the pace, for both jobs.
    assert figures["efficiency"] == round(0.2 / (5 / 24), 4)
    assert figures["turn_stretch"] == 1.0  # every turn 1 s, alone and shared
    assert figures["differences"] == ["grpo: params_sha256 differ"]
    shared[0]["losses"] = [2.0] * 5  # sft trained otherwise than both its runs alone: said once
    again = summarize(specs(), before, Outcome(shared, moves, 1), copy=5.0, alone_after=after)
    assert again["differences"] == ["sft: losses differ", "grpo: params_sha256 differ"]
    assert [t["identical"] for t in figures["per_tenant"]] == [True, False]

"""Real TRL jobs (SFTTrainer, GRPOTrainer on tiny Qwen2 models built from configs) taking turns
through `BatonCallback`: alone, then sharing one simulated GPU too small for both, bit for bit."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs trl")


def specs() -> list:
    from agent.examples.trl_train.jobs import TrlConfig
    from commands.demo.trl import TrlSpec

    # GRPO: a reference model (beta > 0, loaded memory-mapped from disk) that TRL's
    # SyncRefModelCallback updates at every step, gradient accumulation, two policy updates per
    # generation, a reward wrapped to run off-turn, evaluation and a checkpoint every two steps,
    # logging every two (so odd steps end without logging), and a user's callback after
    # Baton's that waits, then reads the weights at each step's end.
    # Each waits 0.3 s off-turn between steps (as the demo's mix does), so the two jobs' turns
    # interleave whatever the machine's speed: without it the SFT job can finish its four fast
    # steps before the GRPO job's first turn, and nobody is parked.
    grpo = TrlConfig(
        kind="grpo", seed=2, batch=4, group=4, accumulation=2, iterations=2, off_s=0.3,
        sync_ref_steps=1, eval_steps=2, save_steps=2, log_steps=2, user_s=0.05,
    )  # fmt: skip
    sft = TrlConfig(kind="sft", seed=1, batch=8, off_s=0.3)
    return [TrlSpec("sft", sft, steps=4), TrlSpec("grpo", grpo, steps=4)]


@needs_trl
def test_the_footprint_formula_counts_the_models_parameters() -> None:
    from transformers import Qwen2ForCausalLM

    from agent.examples.trl_train.jobs import TrlConfig, model_config

    for hidden, layers in ((64, 2), (32, 1)):
        config = TrlConfig(hidden=hidden, layers=layers)
        assert Qwen2ForCausalLM(model_config(config)).num_parameters() == config.params()


@needs_trl
@pytest.mark.timeout(300)
def test_trl_jobs_sharing_a_gpu_train_bit_for_bit_as_they_do_alone() -> None:
    from commands.demo.train import run_alone, run_shared, same_training

    tenants = specs()
    alone = asyncio.run(run_alone(tenants, agent=False))
    shared = asyncio.run(run_shared(tenants))
    assert all(r["moves"]["parks"] == 0 for r in alone)
    for spec, a, s in zip(tenants, alone, shared.reports, strict=True):
        assert s["steps"] == spec.steps
        assert len(s["losses"]) == spec.steps // spec.config.log_steps
        assert same_training(a, s) == []
        # The GPU holds one of them at a time: each was parked and restored between its turns.
        assert s["moves"]["parks"] >= 2 and s["moves"]["restores"] >= 2
    grpo = shared.reports[1]
    assert grpo["rewards"] and len(set(alone[0]["losses"])) > 1  # logged on generating steps
    # from_pretrained mapped the GRPO weights; TorchParker copied them once to park them.
    assert grpo["moves"]["copied_bytes"] > 0 and alone[0]["moves"]["copied_bytes"] == 0
    assert shared.moves["park"]["count"] >= 4


@needs_trl
@pytest.mark.timeout(120)
def test_a_tenant_alone_exits_cleanly_and_leaves_no_work_directory(tmp_path) -> None:
    """A TRL tenant run with no agent (`--solo`, the bench's and the demo's "alone" runs) ends
    with exit status 0 and removes its work directory."""
    import json
    import os
    import subprocess

    from agent.examples.trl_train.jobs import TrlConfig
    from commands.demo.trl import TrlSpec

    spec = TrlSpec("sft", TrlConfig(kind="sft", seed=1, batch=8), steps=1)
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    with subprocess.Popen(
        spec.argv(solo=True),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    ) as proc:
        out, err = proc.communicate("go inf\nexit\n", timeout=100)
    events = [json.loads(line)["event"] for line in out.splitlines() if line.startswith("{")]
    assert events[-1] == "done", err[-2000:]
    assert proc.returncode == 0, err[-2000:]
    assert not list(tmp_path.glob("baton-trl-*"))

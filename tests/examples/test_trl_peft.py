"""TRL jobs that fine-tune LoRA adapters (peft): an SFT job given `peft_config` and a GRPO job on
a `get_peft_model` model, each parked by another job at every step on a real agent (`app`
backend), train bit for bit as they do alone, with no agent: adapters, frozen base weights,
optimizer state and losses."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from tests.examples.trl_jobs import Jobs, on_the_device

needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs trl")
needs_peft = pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="needs peft")
STEPS = 3


def lora() -> Any:
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)


def lora_trainer(kind: str, workdir: Path, callbacks: list[Any], wrap: Any) -> Any:
    """A LoRA job of STEPS steps: SFT given `peft_config`, GRPO (beta > 0: TRL adds a frozen
    `ref` adapter) on a model wrapped by `get_peft_model`, memory-mapped from disk; `wrap`
    wraps a function its steps call between their turns (SFT's collator, GRPO's reward)."""
    from peft import get_peft_model
    from trl import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

    from agent.examples.trl_train import jobs as trl

    config = trl.TrlConfig(kind=kind, seed=8, batch=4, group=4)
    common = trl.options(config, STEPS, workdir)
    if kind == "sft":
        sft = SFTConfig(per_device_train_batch_size=4, max_length=32, **common)
        job = trl.quiet(SFTTrainer(
            model=trl.model(config, workdir), args=sft, train_dataset=trl.dataset(config, 32),
            processing_class=trl.tokenizer(), callbacks=callbacks, peft_config=lora(),
        ))  # fmt: skip
        job.data_collator = wrap(job.data_collator)
        return job
    grpo = GRPOConfig(
        per_device_train_batch_size=4, num_generations=4, max_completion_length=5,
        beta=config.beta, **common,
    )  # fmt: skip
    return trl.quiet(GRPOTrainer(
        model=get_peft_model(trl.model(config, workdir), lora()), args=grpo,
        reward_funcs=[wrap(trl.reverse_reward())], train_dataset=trl.dataset(config, 32),
        processing_class=trl.tokenizer(), callbacks=callbacks,
    ))  # fmt: skip


def outcome(job: Any) -> dict[str, Any]:
    """What the job trained: its adapters, its frozen base weights, Adam's state, its losses."""
    weights = job.model.state_dict()
    state = job.optimizer.state_dict()["state"]
    return {
        "adapters": {k: v.clone() for k, v in weights.items() if "lora_" in k},
        "base": {k: v.clone() for k, v in weights.items() if "lora_" not in k},
        "optimizer": [v.clone() for s in state.values() for v in s.values()],
        "losses": [h["loss"] for h in job.state.log_history if "loss" in h],
    }


def same(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What differs between two outcomes, bit for bit."""
    found = []
    for part in ("adapters", "base"):
        if a[part].keys() != b[part].keys():
            found.append(f"{part}: other tensors")
        found += [f"{part} {k}" for k, v in a[part].items() if not v.equal(b[part][k])]
    pairs = zip(a["optimizer"], b["optimizer"], strict=True)
    found += [f"optimizer {i}" for i, (x, y) in enumerate(pairs) if not x.equal(y)]
    return found + (["losses"] if a["losses"] != b["losses"] else [])


@needs_trl
@needs_peft
@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["sft", "grpo"])
def test_a_lora_job_parked_at_every_step_trains_bit_for_bit_as_alone(
    kind: str, jobs: Jobs, tmp_path: Path
) -> None:
    alone = lora_trainer(kind, tmp_path / "alone", [], lambda fn: fn)
    initial = {k: v.clone() for k, v in alone.model.state_dict().items()}
    alone.train()
    expected = outcome(alone)

    def parked_first(fn: Any) -> Any:  # the other job's turn, between the job's turns
        def call(*args: Any, **kwargs: Any) -> Any:
            jobs.parked_by_the_other_job()
            return fn(*args, **kwargs)

        return jobs.callback.off_turn(call)

    with jobs.callback.turn():
        job = lora_trainer(kind, tmp_path / "shared", [jobs.callback], parked_first)
        jobs.callback.watch(job)
    on_the_device(job.train)
    with jobs.callback.turn():
        shared = outcome(job)

    assert same(expected, shared) == []
    assert expected["adapters"] and len(expected["losses"]) == STEPS
    trained = [k for k, v in expected["adapters"].items() if not v.equal(initial[k])]
    assert any("lora_B" in k for k in trained)  # the adapters learned (B starts at zero)
    changed = [k for k, v in shared["base"].items() if not v.equal(initial[k])]
    assert changed == []  # frozen, restored
    parker = jobs.callback.parker
    assert parker is not None and parker.stats.parks >= STEPS
    # A park moves the frozen base weights too, not only the adapters and their Adam state.
    base_bytes = sum(v.numel() * v.element_size() for v in shared["base"].values())
    assert parker.stats.parked_bytes >= parker.stats.parks * base_bytes

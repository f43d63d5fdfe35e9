"""TRL jobs with nothing downloaded: a tiny Qwen2 built from a config, a character tokenizer, and
the digit-reversal task (`agent.examples.train.task`) as SFT pairs and as a GRPO reward.
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

KINDS = ("sft", "grpo")
CHARS = "0123456789|"
"""The digits and the separator; specials come after them."""


@dataclass(frozen=True)
class TrlConfig:
    """What one TRL job trains, and how."""

    kind: str = "grpo"
    seed: int = 0
    hidden: int = 64
    layers: int = 2
    digits: int = 4
    batch: int = 8
    group: int = 4
    """GRPO: completions per prompt (`num_generations`)."""
    accumulation: int = 1
    iterations: int = 1
    """GRPO: `num_iterations`, policy updates per generated batch."""
    beta: float = 0.04
    """GRPO: KL weight; above 0 the trainer builds a reference model (parked too)."""
    lr: float = 1e-3
    off_s: float = 0.0
    """A modelled wait per step, run off-turn: GRPO's inside its reward function (a remote
    verifier), SFT's per batch fetched (before the step's turn)."""
    sync_ref_steps: int = 0
    """GRPO: above 0, `sync_ref_model` mixes the policy into the reference model every so many
    steps (TRL's `SyncRefModelCallback`, which TRL lists after the user's callbacks)."""
    eval_steps: int = 0
    """Above 0, evaluate on held-out prompts every so many steps."""
    save_steps: int = 0
    """Above 0, write a checkpoint (model, optimizer, RNG) every so many steps."""
    log_steps: int = 1
    """Log the loss every so many steps (each logged figure averages the steps since the last)."""
    user_s: float = 0.0
    """Above 0, a callback of the user's listed after Baton's: at each step's end it waits this
    long, then folds the weights into an average it keeps on the device."""
    device: str = "cpu"

    def params(self) -> int:
        """Parameters of the model (`Qwen2ForCausalLM` of `model_config()`, tied embeddings)."""
        h, inter, kv = self.hidden, 2 * self.hidden, self.hidden // 2
        layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * inter + 2 * h
        return VOCAB * h + self.layers * layer + h

    def footprint_bytes(self) -> int:
        """Bytes a park moves: fp32 weights, gradients, Adam's two moments, the reference."""
        copies = 4 + (1 if self.kind == "grpo" and self.beta > 0 else 0)
        return self.params() * 4 * copies + 64 * 1024  # step counters, small buffers


VOCAB = len(CHARS) + 4


def deterministic(threads: int = 1) -> None:
    """Same results run after run: one thread, deterministic kernels, offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import torch

    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)


def tokenizer() -> Any:
    """A character-level fast tokenizer over CHARS, left padding, with pad/bos/eos/unk."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {c: i for i, c in enumerate([*CHARS, *specials])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
        unk_token="<unk>", padding_side="left",
    )  # fmt: skip


def model_config(config: TrlConfig) -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=VOCAB, hidden_size=config.hidden, intermediate_size=2 * config.hidden,
        num_hidden_layers=config.layers, num_attention_heads=2, num_key_value_heads=1,
        max_position_embeddings=64, tie_word_embeddings=True, pad_token_id=len(CHARS),
        bos_token_id=len(CHARS) + 1, eos_token_id=len(CHARS) + 2,
    )  # fmt: skip


def model(config: TrlConfig, workdir: Path) -> Any:
    """The policy, built from a config with the job's seed. With a reference model the trainer
    rebuilds it from `config._name_or_path`, so the model is saved and loaded from `workdir`."""
    import torch
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(config.seed)
    built = Qwen2ForCausalLM(model_config(config))
    if config.kind != "grpo" or config.beta == 0:
        return built
    path = workdir / "init"
    built.save_pretrained(path)
    return Qwen2ForCausalLM.from_pretrained(path)  # memory-mapped weights on the CPU


def dataset(config: TrlConfig, rows: int) -> Any:
    """Prompts of random digits and their reversals (SFT: prompt/completion; GRPO: prompt)."""
    from datasets import Dataset

    rng = random.Random(config.seed)
    out = []
    for _ in range(rows):
        digits = "".join(rng.choice("0123456789") for _ in range(config.digits))
        row = {"prompt": digits + "|"}
        if config.kind == "sft":
            row["completion"] = digits[::-1]
        out.append(row)
    return Dataset.from_list(out)


def reverse_reward(off_s: float = 0.0) -> Any:
    """The reward: share of the answer's characters right; `off_s` models a slow verifier."""

    def reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        if off_s:
            time.sleep(off_s)
        scores = []
        for prompt, completion in zip(prompts, completions, strict=True):
            want = prompt.rstrip("|")[::-1]
            scores.append(sum(a == b for a, b in zip(want, completion, strict=False)) / len(want))
        return scores

    return reward


def reward(config: TrlConfig, wrap: Any) -> Any:
    """GRPO's reward, wrapped to run off-turn when it models a slow verifier (`off_s`); plain
    scoring takes microseconds, and handing the turn back around it would cost a switch."""
    scoring = reverse_reward(config.off_s)
    return wrap(scoring) if config.off_s else scoring


def data_wait(collate: Any, off_s: float, wrap: Any) -> Any:
    """`collate` after a wait of `off_s` per batch, off-turn (`wrap` hands back a turn held
    since the training began): SFT's modelled fetch of its next batch, as the torch SFT job's
    `off_s`. The trainer fetches a step's batches before the step's turn begins."""

    @wrap
    def fetch(features: Any) -> Any:
        time.sleep(off_s)
        return collate(features)

    return fetch


def weight_average(wait_s: float) -> Any:
    """A user's callback: at each step's end, wait `wait_s`, then fold the model's weights into
    an exponential average kept beside them on the device (reads the weights, writes its own)."""
    import torch
    from transformers import TrainerCallback

    class WeightAverage(TrainerCallback):
        average: list[Any] | None = None

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            time.sleep(wait_s)
            params = [p.detach() for p in kw["model"].parameters()]
            with torch.no_grad():
                if self.average is None:
                    self.average = [p.clone() for p in params]
                else:
                    torch._foreach_lerp_(self.average, params, 0.1)

    return WeightAverage()


def options(config: TrlConfig, steps: int, workdir: Path) -> dict[str, Any]:
    """The `TrainingArguments` every job shares: steps, seeds, logging, evaluation, saving."""
    return dict(
        output_dir=str(workdir / "out"), max_steps=steps or 10**6, learning_rate=config.lr,
        seed=config.seed, data_seed=config.seed, use_cpu=config.device == "cpu",
        report_to="none", logging_steps=config.log_steps, disable_tqdm=True,
        gradient_accumulation_steps=config.accumulation, dataloader_num_workers=0,
        save_strategy="steps" if config.save_steps else "no", save_steps=config.save_steps or 500,
        eval_strategy="steps" if config.eval_steps else "no", eval_steps=config.eval_steps or None,
        per_device_eval_batch_size=config.batch,
    )  # fmt: skip


def trainer(config: TrlConfig, steps: int, workdir: Path, callbacks: list[Any], wrap: Any) -> Any:
    """An `SFTTrainer` or `GRPOTrainer` for `steps` optimizer steps; `wrap` wraps the reward."""
    common = options(config, steps, workdir)
    if config.user_s:
        callbacks = [*callbacks, weight_average(config.user_s)]
    rows = min(steps or 64, 64) * config.batch * config.accumulation * 2  # epochs repeat
    held_out = dataset(replace(config, seed=config.seed + 1), config.batch * 2)
    evaluation = {"eval_dataset": held_out} if config.eval_steps else {}
    if config.kind == "sft":
        from trl import SFTConfig, SFTTrainer

        sft = SFTConfig(per_device_train_batch_size=config.batch, max_length=32, **common)
        job = quiet(SFTTrainer(
            model=model(config, workdir), args=sft, train_dataset=dataset(config, rows),
            processing_class=tokenizer(), callbacks=callbacks, **evaluation,
        ))  # fmt: skip
        if config.off_s:
            job.data_collator = data_wait(job.data_collator, config.off_s, wrap)
        return job
    from trl import GRPOConfig, GRPOTrainer

    grpo = GRPOConfig(
        per_device_train_batch_size=config.batch, num_generations=config.group,
        max_completion_length=config.digits + 1, beta=config.beta,
        num_iterations=config.iterations, sync_ref_model=config.sync_ref_steps > 0,
        ref_model_sync_steps=config.sync_ref_steps or 512, **common,
    )  # fmt: skip
    return quiet(GRPOTrainer(
        model=model(config, workdir), reward_funcs=[reward(config, wrap)],
        args=grpo, train_dataset=dataset(config, rows), processing_class=tokenizer(),
        callbacks=callbacks, **evaluation,
    ))  # fmt: skip


def quiet(trainer: Any) -> Any:
    """The trainer without its printing callbacks: stdout carries the tenant's protocol."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    return trainer


def digest(model: Any) -> str:
    """SHA-256 over the model's parameters and buffers, by name, byte for byte."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().to("cpu", copy=True).contiguous().numpy().tobytes())
    return h.hexdigest()

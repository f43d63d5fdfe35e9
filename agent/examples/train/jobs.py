"""The two training jobs: SFT (cross-entropy on prompt/answer pairs) and GRPO.

Each `step` runs its device phases inside `turn(phase)` (a context manager the caller gives:
a Baton turn, or nothing when alone); scoring and any modelled off-device wait run outside.
GRPO trains on a step's samples and draws the next step's in the same turn, as colocated RL
loops do, so both kinds take one turn per step.
"""

from __future__ import annotations

import copy
import ctypes
import hashlib
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from agent.examples.train import task
from agent.examples.train.model import KVCache, ModelSize, TinyLM, sample, token_logprobs

Turn = Callable[[str], AbstractContextManager[Any]]
"""`turn(phase)`: holds the device for one phase ("train", "generation", ...)."""
KINDS = ("sft", "grpo")


@dataclass(frozen=True)
class JobConfig:
    """What a tenant trains and how big it is; the same flags on a CPU and on a GPU."""

    kind: str = "sft"
    seed: int = 0
    digits: int = 6
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    batch: int = 32
    """SFT: pairs per step. GRPO: prompts per step."""
    group: int = 8
    """GRPO: completions sampled per prompt."""
    lr: float = 1e-3
    beta: float = 0.04
    """GRPO: weight of the KL term to the reference policy."""
    clip: float = 0.2
    epochs: int = 2
    """GRPO: policy-gradient steps on each batch of samples (the clip matters from the second)."""
    off_s: float = 0.0
    """Seconds of modelled off-device work per step (a remote verifier, an environment)."""
    device: str = "cpu"

    def size(self) -> ModelSize:
        """The model's shape for this task."""
        length = 2 * (self.digits + 1)
        return ModelSize(task.VOCAB, length, self.d_model, self.layers, self.heads)


def deterministic(threads: int = 1, device: str = "cpu") -> None:
    """Fixed threads and deterministic kernels, so a run repeats bit for bit."""
    if device.startswith("cuda"):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (so a turn ends when its work does)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Job:
    """Model, optimizer and data stream of one tenant; subclasses define `step`."""

    def __init__(self, config: JobConfig) -> None:
        self.config = config
        self.device = torch.device(config.device)
        torch.manual_seed(config.seed)
        self.model = TinyLM(config.size()).to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.lr)
        for param in self.model.parameters():  # gradients live between turns, as in training
            param.grad = torch.zeros_like(param)
        self.data = torch.Generator().manual_seed(config.seed + 1)
        self.prompt_len = config.digits + 1

    def sources(self) -> list[Any]:
        """What a park moves: parameters, gradients and optimizer state (and subclasses' own)."""
        return [self.model, self.optimizer]

    def step(self, turn: Turn) -> dict[str, float]:
        """One training step; returns its figures (loss, and reward for RL)."""
        raise NotImplementedError

    def update(self, loss: torch.Tensor) -> None:
        """One optimizer step on `loss`."""
        self.optimizer.zero_grad(set_to_none=False)
        loss.backward()
        self.optimizer.step()

    def fingerprint(self) -> float:
        """A cheap summary of the parameters, to check they survived a park."""
        total = torch.stack([p.detach().double().sum() for p in self.model.parameters()]).sum()
        return float(total.item())

    def digest(self) -> str:
        """SHA-256 of every parameter's bytes, in order."""
        h = hashlib.sha256()
        for name, tensor in self.model.state_dict().items():
            flat = tensor.detach().to("cpu").contiguous()
            h.update(name.encode())
            h.update(ctypes.string_at(flat.data_ptr(), flat.numel() * flat.element_size()))
        return h.hexdigest()

    def off_device(self) -> None:
        """The modelled off-device work of a step."""
        if self.config.off_s > 0:
            time.sleep(self.config.off_s)


class SftJob(Job):
    """Supervised fine-tuning: cross-entropy on the answer tokens of prompt/answer pairs."""

    def step(self, turn: Turn) -> dict[str, float]:
        prompt = task.prompts(self.config.batch, self.config.digits, self.data)
        seqs_cpu = torch.cat([prompt, task.answers(prompt)], dim=1)
        self.off_device()
        with turn("train"):
            seqs = seqs_cpu.to(self.device)
            logits = self.model(seqs[:, :-1])[:, self.prompt_len - 1 :]
            loss = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), seqs[:, self.prompt_len :].reshape(-1)
            )
            self.update(loss)
            value = float(loss.item())
        return {"loss": value}


class GrpoJob(Job):
    """GRPO: sample a group per prompt, score off the device, clipped PG with a KL term."""

    def __init__(self, config: JobConfig) -> None:
        super().__init__(config)
        self.reference = copy.deepcopy(self.model).requires_grad_(False)
        for param in self.reference.parameters():
            param.grad = None
        rows = config.batch * config.group
        self.cache = KVCache(config.size(), rows, self.device)
        self.sampler = torch.Generator(device=self.device).manual_seed(config.seed + 2)
        self._samples: list[list[int]] | None = None

    def sources(self) -> list[Any]:
        return [*super().sources(), self.reference, *self.cache.tensors()]

    def step(self, turn: Turn) -> dict[str, float]:
        """Score the step's samples off the device, then one turn: train on them, and sample
        the next step's (the weights are on the device already). The first step samples first."""
        c = self.config
        if self._samples is None:
            with turn("generation"):
                self._samples = self._generate()
        rows = self._samples
        rewards = torch.tensor(
            [task.reward(r[: self.prompt_len], r[self.prompt_len :]) for r in rows]
        )
        grouped = rewards.view(c.batch, c.group)
        adv = (grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)
        advantages = adv.reshape(-1).tolist()
        self.off_device()
        with turn("training+generation"):
            loss, kl = self._train(rows, advantages)
            self._samples = self._generate()
        return {"loss": loss, "reward": float(rewards.mean().item()), "kl": kl}

    def _generate(self) -> list[list[int]]:
        """A group of sampled completions per new prompt, as token lists (off the device)."""
        c = self.config
        prompt = task.prompts(c.batch, c.digits, self.data).repeat_interleave(c.group, 0)
        seqs = sample(self.model, prompt.to(self.device), c.digits + 1, self.cache, self.sampler)
        rows: list[list[int]] = seqs.tolist()
        return rows

    def _train(self, rows: list[list[int]], advantages: list[float]) -> tuple[float, float]:
        """The clipped policy-gradient steps with the KL term; returns the last loss and KL."""
        c = self.config
        seqs = torch.tensor(rows, device=self.device)
        adv = torch.tensor(advantages, device=self.device)[:, None]
        with torch.no_grad():
            old = token_logprobs(self.model, seqs, self.prompt_len)
            ref = token_logprobs(self.reference, seqs, self.prompt_len)
        loss = kl = torch.zeros((), device=self.device)
        for _ in range(c.epochs):
            logp = token_logprobs(self.model, seqs, self.prompt_len)
            ratio = torch.exp(logp - old)
            pg = -torch.min(ratio * adv, ratio.clamp(1 - c.clip, 1 + c.clip) * adv)
            kl = (torch.exp(ref - logp) - (ref - logp) - 1).mean()
            loss = pg.mean() + c.beta * kl
            self.update(loss)
        return float(loss.item()), float(kl.item())


def make_job(config: JobConfig) -> Job:
    """The job of `config.kind`."""
    if config.kind == "sft":
        return SftJob(config)
    if config.kind == "grpo":
        return GrpoJob(config)
    raise ValueError(f"unknown tenant kind {config.kind!r}; choose one of {', '.join(KINDS)}")


def estimate_bytes(config: JobConfig) -> int:
    """Bytes a park of this job moves, worked out without allocating the model."""
    with torch.device("meta"):
        model = TinyLM(config.size())
    tensors = list(model.parameters())
    params = sum(p.numel() * p.element_size() for p in tensors)
    total = 4 * params  # parameters, gradients, Adam's two moments
    if config.device == "cpu":
        total += 4 * len(tensors)  # Adam's step counters live on the CPU
    if config.kind == "grpo":
        s = config.size()
        cache = 2 * s.layers * config.batch * config.group * s.heads * s.max_len * s.head_dim
        total += params + 4 * cache
    return total

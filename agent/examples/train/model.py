"""A small causal transformer in plain PyTorch, with a reusable key/value cache for sampling."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ModelSize:
    """The transformer's shape."""

    vocab: int
    max_len: int
    d_model: int = 64
    layers: int = 2
    heads: int = 4

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.d_model // self.heads


class KVCache:
    """Keys and values of the sequences being sampled; allocated once, reused by every sample."""

    def __init__(self, size: ModelSize, batch: int, device: torch.device) -> None:
        shape = (size.layers, batch, size.heads, size.max_len, size.head_dim)
        self.keys = torch.zeros(shape, device=device)
        self.values = torch.zeros(shape, device=device)

    def tensors(self) -> list[torch.Tensor]:
        """What parking must move."""
        return [self.keys, self.values]


class Attention(nn.Module):
    """Causal multi-head self-attention; masked matmuls, so every backend computes it alike."""

    def __init__(self, size: ModelSize) -> None:
        super().__init__()
        self.size = size
        self.qkv = nn.Linear(size.d_model, 3 * size.d_model)
        self.proj = nn.Linear(size.d_model, size.d_model)

    def forward(
        self, x: torch.Tensor, layer: int, cache: KVCache | None, start: int
    ) -> torch.Tensor:
        b, t, _ = x.shape
        s = self.size
        q, k, v = self.qkv(x).view(b, t, 3, s.heads, s.head_dim).permute(2, 0, 3, 1, 4)
        if cache is not None:
            cache.keys[layer, :b, :, start : start + t] = k
            cache.values[layer, :b, :, start : start + t] = v
            k = cache.keys[layer, :b, :, : start + t]
            v = cache.values[layer, :b, :, : start + t]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(s.head_dim)
        query_pos = torch.arange(start, start + t, device=x.device)[:, None]
        key_pos = torch.arange(k.shape[2], device=x.device)[None, :]
        att = att.masked_fill(key_pos > query_pos, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, s.d_model)
        out: torch.Tensor = self.proj(y)
        return out


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, size: ModelSize) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(size.d_model)
        self.attn = Attention(size)
        self.norm2 = nn.LayerNorm(size.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(size.d_model, 4 * size.d_model),
            nn.GELU(),
            nn.Linear(4 * size.d_model, size.d_model),
        )

    def forward(
        self, x: torch.Tensor, layer: int, cache: KVCache | None, start: int
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), layer, cache, start)
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


class TinyLM(nn.Module):
    """Token and position embeddings, `layers` blocks, a final norm and the output head."""

    def __init__(self, size: ModelSize) -> None:
        super().__init__()
        self.size = size
        self.tokens = nn.Embedding(size.vocab, size.d_model)
        self.positions = nn.Embedding(size.max_len, size.d_model)
        self.blocks = nn.ModuleList(Block(size) for _ in range(size.layers))
        self.norm = nn.LayerNorm(size.d_model)
        self.head = nn.Linear(size.d_model, size.vocab)

    def forward(
        self, idx: torch.Tensor, cache: KVCache | None = None, start: int = 0
    ) -> torch.Tensor:
        """Logits [batch, len, vocab] for tokens at positions `start` onward."""
        pos = torch.arange(start, start + idx.shape[1], device=idx.device)
        x = self.tokens(idx) + self.positions(pos)[None]
        for layer, block in enumerate(self.blocks):
            x = block(x, layer, cache, start)
        logits: torch.Tensor = self.head(self.norm(x))
        return logits


def token_logprobs(model: TinyLM, seqs: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """Log-probabilities [batch, len - prompt_len] of each sequence's completion tokens."""
    logits = model(seqs[:, :-1])[:, prompt_len - 1 :]
    return torch.gather(F.log_softmax(logits, -1), 2, seqs[:, prompt_len:, None]).squeeze(2)


@torch.no_grad()
def sample(
    model: TinyLM,
    prompt: torch.Tensor,
    new_tokens: int,
    cache: KVCache,
    generator: torch.Generator,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Prompts followed by `new_tokens` sampled tokens (Gumbel-max on the device's generator)."""
    seqs = prompt
    logits = model(prompt, cache, 0)[:, -1]
    for i in range(new_tokens):
        u = torch.rand(logits.shape, device=logits.device, generator=generator)
        gumbel = -torch.log(-torch.log(u.clamp_min(1e-20)))
        token = (logits / temperature + gumbel).argmax(-1, keepdim=True)
        seqs = torch.cat([seqs, token], dim=1)
        if i + 1 < new_tokens:
            logits = model(token, cache, seqs.shape[1] - 1)[:, -1]
    return seqs

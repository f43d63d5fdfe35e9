"""The task, made in code: reverse a string of digits. The reward checks the answer exactly.

A prompt is `digits` random digits and SEP; the answer is the digits reversed, then EOS.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

DIGITS = 10
SEP = 10
EOS = 11
VOCAB = 12


def prompts(batch: int, digits: int, generator: torch.Generator) -> torch.Tensor:
    """`batch` prompts, [batch, digits + 1] on the CPU: random digits, then SEP."""
    body = torch.randint(0, DIGITS, (batch, digits), generator=generator)
    return torch.cat([body, torch.full((batch, 1), SEP)], dim=1)


def answers(prompt: torch.Tensor) -> torch.Tensor:
    """The correct answers, [batch, digits + 1]: the prompt's digits reversed, then EOS."""
    body = prompt[:, :-1].flip(1)
    return torch.cat([body, torch.full((prompt.shape[0], 1), EOS)], dim=1)


def reward(prompt: Sequence[int], completion: Sequence[int]) -> float:
    """Share of the answer's positions the completion got right (1.0: exactly the answer)."""
    want = [*reversed(prompt[:-1]), EOS]
    return sum(1 for a, b in zip(want, completion, strict=False) if a == b) / len(want)

"""TRL tenants (`agent.examples.trl_train`) for `commands.demo.train`: the demo and the bench."""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields, replace
from typing import Any

from agent.examples.trl_train.jobs import TrlConfig
from baton.contract.names import MIB

TENANT = [sys.executable, "-m", "agent.examples.trl_train.tenant"]


@dataclass(frozen=True)
class TrlSpec:
    """One TRL tenant: its name, what it trains, and for how many steps (0: until the deadline)."""

    name: str
    config: TrlConfig
    steps: int = 0
    duty: int = 0

    def argv(self, solo: bool) -> list[str]:
        """The tenant process's command line."""
        flags = [
            f"--{f.name.replace('_', '-')}={getattr(self.config, f.name)}"
            for f in fields(TrlConfig)
        ]
        extra = ["--duty", str(self.duty)] if self.duty else []
        mode = ["--solo"] if solo else []
        return [*TENANT, "--name", self.name, "--steps", str(self.steps), *flags, *mode, *extra]

    def footprint_mib(self) -> float:
        """MiB a park of this tenant moves."""
        return self.config.footprint_bytes() / MIB


@dataclass(frozen=True)
class TrlMix:
    """K TRL tenants, GRPO and SFT in turn, on tiny Qwen2 models built from configs."""

    tenants: int = 2
    steps: int = 12
    device: str = "cpu"
    hidden: int = 64
    grpo_off_s: float = 0.3
    """GRPO's modelled verifier wait per step, run off-turn through `BatonCallback.off_turn`."""
    sft_off_s: float = 0.3
    """SFT's modelled wait for its next batch per step, off-turn (as `TrainMix.sft_off_s`): with
    none, an SFT step is over ten times shorter than a GRPO step and ends its run alone."""
    sft_batch: int = 8
    grpo_batch: int = 8
    """GRPO completions a step (TRL's `per_device_train_batch_size`), `TrlConfig.group` a prompt."""
    fits: int = 0
    """Tenants the shared GPU holds at once; 0: all but one."""

    def specs(self) -> list[TrlSpec]:
        """The K tenants, each with its own seed; GRPO with a reference model (beta > 0)."""
        out = []
        for i in range(self.tenants):
            kind = ("grpo", "sft")[i % 2]
            grpo = kind == "grpo"
            config = TrlConfig(
                kind=kind, seed=100 + i, hidden=self.hidden, device=self.device,
                off_s=self.grpo_off_s if grpo else self.sft_off_s,
                batch=self.grpo_batch if grpo else self.sft_batch,
            )  # fmt: skip
            out.append(TrlSpec(f"t{i + 1}-trl-{kind}", config, steps=self.steps))
        return out


SHORT_STEPS = TrlMix(
    tenants=4, steps=30, grpo_off_s=0.0, sft_off_s=0.0, sft_batch=128, grpo_batch=64, fits=1
)
"""Four jobs of short steps (about 0.1 s on a core of the 2-vCPU development machines: 128 SFT
pairs, or 64 GRPO completions of 16 prompts; smaller batches make them shorter) with nothing
off-turn, on a GPU that holds one of them: every turn is a handover (park the leaving job,
restore the next), so what a handover costs is what the efficiency loses."""
MIXES = {"default": TrlMix(tenants=3), "short": SHORT_STEPS}
"""`baton bench train --framework trl --mix NAME`."""


def trl_mix(name: str, **given: Any) -> TrlMix:
    """The named mix with the given fields changed (those given as None left alone)."""
    if name not in MIXES:
        raise ValueError(f"--mix {name!r}: one of {', '.join(MIXES)}")
    mix = replace(MIXES[name], **{k: v for k, v in given.items() if v is not None})
    group = TrlConfig().group
    if mix.grpo_batch % group:
        raise ValueError(
            f"--grpo-batch {mix.grpo_batch}: GRPO completions a step, a multiple of the "
            f"{group} each prompt gets"
        )
    if mix.hidden % 4:
        raise ValueError(f"--d-model {mix.hidden}: a multiple of 4 (two heads of even width)")
    return mix

"""TRL tenants (`agent.examples.trl_train`) for `baton.demo.train`: the demo and the bench."""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields

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

    def specs(self) -> list[TrlSpec]:
        """The K tenants, each with its own seed; GRPO with a reference model (beta > 0)."""
        out = []
        for i in range(self.tenants):
            kind = ("grpo", "sft")[i % 2]
            config = TrlConfig(
                kind=kind, seed=100 + i, hidden=self.hidden, device=self.device,
                off_s=self.grpo_off_s if kind == "grpo" else self.sft_off_s,
            )  # fmt: skip
            out.append(TrlSpec(f"t{i + 1}-trl-{kind}", config, steps=self.steps))
        return out

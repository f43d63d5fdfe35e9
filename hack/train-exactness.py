"""Exactness of real training tenants on a device: alone against sharing one GPU, bit for bit.

    python hack/train-exactness.py --device cuda          # on a machine with an NVIDIA GPU
    python hack/train-exactness.py --device cpu --small   # the sizes `make test` uses

Trains an SFT and a GRPO tenant alone (no agent), then both on one GPU of an agent with the
`app` backend whose inventory holds one of them at a time, so every switch parks a tenant
through its `TorchParker` (pinned buffers, several CUDA streams, one sync; freed blocks go back
to the driver). Prints one JSON object; exits 1 when any loss, reward or parameter differs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import replace

from agent.examples.train.jobs import JobConfig
from commands.demo.train import TenantSpec, run_alone, run_shared, same_training

GPU_SIZES = {"d_model": 512, "layers": 8, "heads": 8, "digits": 16}
"""Real sizes for a GPU: about 25 M parameters, steps of a fraction of a second."""
SMALL = {"d_model": 64, "layers": 2, "heads": 4, "digits": 6}


def specs(device: str, small: bool, steps: int) -> list[TenantSpec]:
    """One SFT and one GRPO tenant of the chosen sizes."""
    sizes = SMALL if small else GPU_SIZES
    base = JobConfig(device=device, **sizes)
    sft = replace(base, kind="sft", seed=1, batch=16 if small else 256)
    grpo = replace(base, kind="grpo", seed=2, batch=4 if small else 32, group=4 if small else 8)
    return [TenantSpec("sft", sft, steps=steps), TenantSpec("grpo", grpo, steps=steps)]


def reserved_mib(moves: dict[str, int]) -> list[int]:
    """`torch.cuda.memory_reserved` MiB before and after the tenant's last park (0 on a CPU)."""
    return [moves["reserved_before_park"] >> 20, moves["reserved_after_park"] >> 20]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--device", default="cuda", help="cuda (a GPU), or cpu")
    p.add_argument("--small", action="store_true", help="test sizes instead of real ones")
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args()
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            print("train-exactness: --device cuda, but torch sees no CUDA GPU", file=sys.stderr)
            return 2
    tenants = specs(args.device, args.small, args.steps)
    alone = asyncio.run(run_alone(tenants, agent=False))
    shared = asyncio.run(run_shared(tenants))
    diffs = [d for a, s in zip(alone, shared.reports, strict=True) for d in same_training(a, s)]
    parks = {r["name"]: r["moves"]["parks"] for r in shared.reports}
    result = {
        "device": args.device,
        "steps": args.steps,
        "footprint_mib": {t.name: round(t.footprint_mib(), 1) for t in tenants},
        "parks": parks,
        "park_s": {r["name"]: round(r["moves"]["park_s"], 4) for r in shared.reports},
        "restore_s": {r["name"]: round(r["moves"]["restore_s"], 4) for r in shared.reports},
        "memory_reserved_mib": {r["name"]: reserved_mib(r["moves"]) for r in shared.reports},
        "identical": not diffs,
        "differences": diffs,
    }
    print(json.dumps(result))
    if not all(parks.values()):
        print("train-exactness: a tenant was never parked", file=sys.stderr)
        return 1
    reserved = {r["name"]: reserved_mib(r["moves"]) for r in shared.reports}
    kept = [name for name, (before, after) in reserved.items() if after >= before]
    if args.device.startswith("cuda") and kept:
        print(f"train-exactness: a park freed no reserved memory: {kept}", file=sys.stderr)
        return 1
    return 0 if not diffs else 1


if __name__ == "__main__":
    sys.exit(main())

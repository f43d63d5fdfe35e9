"""`baton bench train`: real SFT and GRPO tenants alone, then sharing one device, as `duty` does.

Each tenant trains a fixed number of steps, first by itself (one after another, each through an
agent on a GPU of its own), then all at once on one simulated GPU that holds all but one of them
(two of three, as in `duty`): switches park a tenant through its `TorchParker` (`app` backend),
and the agent restores the tenant due next while another trains, then by itself again. The
reference for each tenant is the mean of its two runs alone, one before and one after the
shared run, so a machine whose speed drifts over the run (other work on its host) moves the
reference as it moves the shared run. `identical`: each tenant's per-step losses, rewards and
final parameters equal those of both its runs alone.

Duty alone is time inside turns over wall time, from a tenant's own turn records; the ideal is
their sum (at most 1). The shared window runs from the last tenant's first grant to the first
tenant's last yield, while all of them train. `efficiency` counts training done, not time held:
each tenant's steps/s in the window over its steps/s alone, weighted by its duty alone, gives
the device time its progress is worth at its own pace (`achieved_duty`); over the ideal, that is
the share of the possible sharing that became training. Time held (`timesliced_duty`,
`turn_efficiency`) is reported beside it but is not the measure: on the CPU turns stretch when
the cores are contended (`turn_stretch`: a turn's length shared over alone, weighted by duty
alone), which counts as busy without training more, and a job's phases are
not the same all through its run, so a window's busy share moves with which phases it caught.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from commands.bench.handovers import summary as handover_summary
from commands.demo.train import (
    Outcome,
    Spec,
    TrainMix,
    run_alone,
    run_shared,
    same_training,
    shared_gpu_mib,
)

if TYPE_CHECKING:
    from commands.demo.trl import TrlMix


def busy(turns: Sequence[Sequence[Any]], t0: float, t1: float) -> float:
    """Seconds of [t0, t1] inside the turns ([lease, requested, granted, yielded])."""
    return sum(max(0.0, min(t[3], t1) - max(t[2], t0)) for t in turns)


def alone_duty(report: dict[str, Any]) -> float:
    """A tenant's time in turns over its run alone, first grant to last yield."""
    turns = report["turns"]
    t0, t1 = turns[0][2], turns[-1][3]
    return busy(turns, t0, t1) / (t1 - t0) if t1 > t0 else 0.0


def rate(step_ends: Sequence[float], t0: float, t1: float) -> float:
    """Steps per second finished within [t0, t1]."""
    done = [t for t in step_ends if t0 <= t <= t1]
    if len(done) < 2:
        return 0.0
    return (len(done) - 1) / (done[-1] - done[0])


def device_s_per_turn(report: dict[str, Any]) -> float:
    """Mean seconds a turn was held: grows when tenants contend for the same cores."""
    turns = report["turns"][1:]
    return sum(t[3] - t[2] for t in turns) / len(turns) if turns else 0.0


def idle_waits(reports: Sequence[dict[str, Any]], t0: float, t1: float) -> list[float]:
    """Per grant in [t0, t1], how long the device sat free while that tenant already asked."""
    turns = sorted((t for r in reports for t in r["turns"]), key=lambda t: t[2])
    waits, free_since = [], float("-inf")
    for _, requested, granted, yielded in turns:
        if t0 <= granted <= t1:
            waits.append(max(0.0, granted - max(free_since, requested)))
        free_since = max(free_since, yielded)
    return waits


def turn_stretch(per_tenant: Sequence[dict[str, Any]]) -> float:
    """How much longer the tenants' turns ran shared than alone, weighted by their duty alone
    (as `achieved_duty` weighs their paces): what the efficiency lost beside the idle device."""
    pairs = [
        (t["duty_alone"], t["turn_s_shared"] / t["turn_s_alone"])
        for t in per_tenant
        if t["turn_s_alone"] > 0
    ]
    weight = sum(w for w, _ in pairs)
    return round(sum(w * r for w, r in pairs) / weight, 4) if weight else 0.0


def copy_gbps(nbytes: int, device: str, repeats: int = 5) -> float:
    """A plain device-to-host copy of `nbytes` into one reused host buffer, as a park does."""
    import torch

    torch.set_num_threads(1)
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=src.is_cuda)
    dst.copy_(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src, non_blocking=src.is_cuda)
        if src.is_cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return nbytes / best / 1e9


def mean_alone(runs: Sequence[dict[str, Any]], figure: Callable[[dict[str, Any]], float]) -> float:
    """A tenant's figure alone, averaged over its runs alone (before and after the shared run)."""
    return sum(figure(r) for r in runs) / len(runs)


def summarize(
    specs: Sequence[Spec],
    alone: list[dict[str, Any]],
    shared: Outcome,
    copy: float,
    alone_after: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The bench's JSON fields, then figures that explain them. Each tenant's reference is the
    mean of its runs alone: `alone` (before the shared run) and `alone_after` where given."""
    reports = shared.reports
    t0 = max(r["turns"][0][2] for r in reports)
    t1 = min(r["turns"][-1][3] for r in reports)
    window = t1 - t0
    runs_alone = [[a] for a in alone] if alone_after is None else [
        [a, b] for a, b in zip(alone, alone_after, strict=True)
    ]  # fmt: skip
    baseline = [mean_alone(runs, alone_duty) for runs in runs_alone]
    ideal = min(1.0, sum(baseline))
    timesliced = sum(busy(r["turns"], t0, t1) for r in reports) / window if window > 0 else 0.0
    paces_alone = [[rate(r["step_ends"], 0.0, float("inf")) for r in runs] for runs in runs_alone]
    rates_alone = [sum(paces) / len(paces) for paces in paces_alone]
    rates_shared = [rate(s["step_ends"], t0, t1) for s in reports]
    # Each tenant's steps/s while sharing over its steps/s alone, weighted by its duty alone.
    achieved = sum(
        duty * (shared_ / alone_ if alone_ else 0.0)
        for duty, alone_, shared_ in zip(baseline, rates_alone, rates_shared, strict=True)
    )
    moves = [r["moves"] for r in reports]
    parked = sum(m["parked_bytes"] for m in moves)
    restored = sum(m["restored_bytes"] for m in moves)
    park_s = sum(m["park_s"] for m in moves)
    restore_s = sum(m["restore_s"] for m in moves)
    waits = sorted(idle_waits(reports, t0, t1))
    differing = [  # a difference from both runs alone is one difference
        list(dict.fromkeys(d for a in runs for d in same_training(a, s)))
        for runs, s in zip(runs_alone, reports, strict=True)
    ]
    per_tenant = []
    tenants = zip(
        specs, runs_alone, reports, baseline, paces_alone, rates_alone, rates_shared, differing,
        strict=True,
    )  # fmt: skip
    for spec, runs, s, duty, paces, alone_rate, shared_rate, differs in tenants:
        per_tenant.append(
            {
                "name": spec.name, "kind": spec.config.kind,
                "footprint_mib": round(spec.footprint_mib(), 2), "off_s": spec.config.off_s,
                "steps": s["steps"], "duty_alone": round(duty, 4),
                "steps_per_s_alone": round(alone_rate, 3),
                "steps_per_s_alone_runs": [round(pace, 3) for pace in paces],
                "steps_per_s_shared": round(shared_rate, 3),
                "turn_s_alone": round(mean_alone(runs, device_s_per_turn), 4),
                "turn_s_shared": round(device_s_per_turn(s), 4),
                "parks": s["moves"]["parks"],
                "identical": not differs,
            }
        )  # fmt: skip
    return {
        "tenants": len(specs),
        "baseline_duty": round(sum(baseline) / len(baseline), 4),
        "achieved_duty": round(achieved, 4),
        "ideal_duty": round(ideal, 4),
        "efficiency": round(achieved / ideal, 4) if ideal else 0.0,
        "timesliced_duty": round(timesliced, 4),
        "turn_efficiency": round(timesliced / ideal, 4) if ideal else 0.0,
        "turn_stretch": turn_stretch(per_tenant),
        "steps_per_s": {
            t["name"]: {"alone": t["steps_per_s_alone"], "shared": t["steps_per_s_shared"]}
            for t in per_tenant
        },
        "park_gbps": round(parked / park_s / 1e9, 3) if park_s else 0.0,
        "restore_gbps": round(restored / restore_s / 1e9, 3) if restore_s else 0.0,
        "copy_gbps": round(copy, 3),
        "identical": not any(differing),
        "differences": [d for differs in differing for d in differs],
        "device": specs[0].config.device,
        "shared_window_s": round(window, 3),
        "shared_gpu_mib": shared.gpu_mib,
        "parks": int(shared.moves["park"]["count"]),
        "restores": int(shared.moves["restore"]["count"]),
        "moved_bytes": parked + restored,
        "idle_s": round(window * (1 - timesliced), 3),
        "idle_while_waited_s": round(sum(waits), 3),
        "grant_wait_p50_ms": round(waits[len(waits) // 2] * 1000, 2) if waits else 0.0,
        **handover_summary(reports, shared.moves, t0, t1),
        "per_tenant": per_tenant,
    }


async def _run(config: TrainMix | TrlMix) -> dict[str, Any]:
    specs = config.specs()
    fits = getattr(config, "fits", 0) or len(specs) - 1
    shared_gpu_mib(specs, fits)  # sizes the shared run cannot take are refused before any run
    alone = await run_alone(specs)
    shared = await run_shared(specs, fits=fits)
    after = await run_alone(specs)
    largest = max(r["footprint_bytes"] for r in shared.reports)
    return summarize(specs, alone, shared, copy_gbps(largest, config.device), alone_after=after)


def run(config: TrainMix | TrlMix) -> dict[str, Any]:
    """Run the bench; returns its JSON fields."""
    if config.tenants < 2:
        raise ValueError("the bench needs at least two tenants to share a device")
    return asyncio.run(_run(config))

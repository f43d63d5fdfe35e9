"""`baton bench fairness`: skewed tenants on one GPU under the `fair` policy and under FIFO.

The load runs on the agent's own lease table (`agent.core.leases`, the policy exactly as the
agent runs it) with an injected clock, so a fixed span of GPU time is replayed in a moment and
both policies see the same load; the policy's cost on a real handoff is `bench handoff` run
with each policy in the same run.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from agent.core.fair import FairConfig, FairShare
from agent.core.leases import LeaseTable
from commands.bench.fairness_procs import Run, measure, run_figures
from commands.bench.shares import MIXES, RETURN_S, Load, better, figures, targets


def simulate(mix: dict[str, Load], seconds: float, policy: str | FairShare) -> dict[str, Any]:
    """Run `mix` on one GPU for `seconds` of injected time: held seconds and waits per tenant.

    Events come in the order a client sees them: a tenant asks again `gap` after its yield was
    answered, no sooner than `RETURN_S` after the yield."""
    now = [0.0]
    ids = itertools.count()
    table = LeaseTable(
        clock=lambda: now[0], policy=policy, max_hold=1e9, new_id=lambda: f"w{next(ids)}"
    )
    wake = dict.fromkeys(mix, 0.0)
    since: dict[str, float] = {}
    held = dict.fromkeys(mix, 0.0)
    waits: dict[str, list[float]] = {name: [] for name in mix}
    holder: tuple[str, str, float] | None = None
    while now[0] < seconds:
        for name, at in list(wake.items()):
            if at <= now[0]:
                table.enqueue(name, ["gpu"], duty=mix[name].duty, tier=mix[name].tier)
                since[name] = now[0]
                del wake[name]
        table.tick()  # holds for yielders that did not come back in time run out
        if holder is None:
            for waiter in table.pick():
                lease = table.grant(waiter.waiter_id)
                waits[lease.tenant_id].append(now[0] - since.pop(lease.tenant_id))
                holder = (lease.tenant_id, lease.lease_id, now[0] + mix[lease.tenant_id].turn)
        due = table.next_deadline(after=now[0])
        ends = [holder[2] if holder else seconds, seconds, *([due] if due else [])]
        now[0] = min([*wake.values(), *ends])
        if holder is not None and holder[2] <= now[0]:
            name, lease_id, _ = holder
            table.release(lease_id, yielded=True)
            held[name] += mix[name].turn
            wake[name] = now[0] + mix[name].gap + RETURN_S
            holder = None
    for name, start in since.items():
        waits[name].append(seconds - start)
    return {"held": held, "waits": waits}


def run_fairness_bench(
    seconds: float = 600.0,
    handoff_iterations: int = 500,
    config: FairConfig | None = None,
    mixes: list[str] | None = None,
    process_seconds: float = 0.0,
    process_rounds: int = 3,
) -> dict[str, Any]:
    """The fair policy against FIFO on the same load, for each mix (the first one's figures at
    the top level); handoff p50 of each policy (same run); the targets and, per mix, whether
    the fair policy was better. With `process_seconds`, each mix also runs that long as tenant
    processes against a real agent under each policy (`process`, `process_fair_better`), in
    `process_rounds` runs of each that take turns."""
    from commands.bench.handoff import run_handoff_bench

    config = config or FairConfig()
    names = mixes or list(MIXES)
    unknown = [n for n in names if n not in MIXES]
    if unknown:
        raise ValueError(f"unknown mix {', '.join(unknown)}; the mixes are {', '.join(MIXES)}")
    if process_rounds < 1:
        raise ValueError(f"--process-rounds {process_rounds} must be at least 1")
    if not 0 < seconds < math.inf:
        raise ValueError(f"--seconds {seconds:g} must be a finite number above 0")
    if not 0 <= process_seconds < math.inf:
        raise ValueError(f"--process-seconds {process_seconds:g} must be 0 (replay only) or finite")
    if handoff_iterations < 0:
        raise ValueError(f"--handoff-iterations {handoff_iterations} must be 0 (skip) or more")
    turn, longest = max((load.turn, n) for n in names for load in MIXES[n].values())
    if seconds < turn:
        raise ValueError(
            f"--seconds {seconds:g} is shorter than the longest turn of mix {longest} "
            f"({turn:g} s): no turn might end in the replay; give {turn:g} or more"
        )
    per_mix: dict[str, dict[str, Any]] = {}
    for name in names:
        mix = MIXES[name]
        window = config.anticipate_s
        fair = figures(mix, simulate(mix, seconds, FairShare(config)), seconds, window)
        fifo = figures(mix, simulate(mix, seconds, "fifo"), seconds, window)
        per_mix[name] = {
            **fair,
            "targets": targets(fair, config.tier_grace_s),
            **{f"reference_{k}": v for k, v in fifo.items()},
            "reference_targets": targets(fifo, config.tier_grace_s),
            "fair_better": better(fair, fifo),
        }
        if process_seconds > 0:
            per_mix[name]["process"] = process_run(mix, process_seconds, config, process_rounds)
    out: dict[str, Any] = {
        "mix": names[0],
        **per_mix[names[0]],
        "seconds": seconds,
        "min_share": config.min_share,
        "credit_s": config.credit_s,
        "tier_grace_s": config.tier_grace_s,
        "mixes": per_mix,
        "fair_better_for_every_mix": all(m["fair_better"] for m in per_mix.values()),
    }
    if process_seconds > 0:
        out["process_seconds"] = process_seconds
        out["process_rounds"] = process_rounds
        out["process_fair_better_for_every_mix"] = all(
            m["process"]["fair_better"] for m in per_mix.values()
        )
    if handoff_iterations > 0:
        fair_handoff = run_handoff_bench(handoff_iterations, queue_policy="fair")
        fifo_handoff = run_handoff_bench(handoff_iterations, queue_policy="fifo")
        out["handoff_p50_ms"] = fair_handoff["handoff_p50_ms"]
        out["handoff_p99_ms"] = fair_handoff["handoff_p99_ms"]
        out["reference_handoff_p50_ms"] = fifo_handoff["handoff_p50_ms"]
        out["reference_handoff_p99_ms"] = fifo_handoff["handoff_p99_ms"]
        out["handoff_iterations"] = handoff_iterations
        out["targets"]["handoff_p50_within_10pct"] = (
            out["handoff_p50_ms"] <= 1.1 * out["reference_handoff_p50_ms"]
        )
    return out


def process_run(
    mix: dict[str, Load], seconds: float, config: FairConfig, rounds: int
) -> dict[str, Any]:
    """One mix as tenant processes against a real agent for `seconds` under each policy, in
    `rounds` runs of each, the policies taking turns (fair, FIFO, then FIFO, fair, ...: a drift
    of the machine's speed weighs on both alike); figures of each policy's runs together, and
    the targets."""
    runs: dict[str, list[Run]] = {"fair": [], "fifo": []}
    for i in range(rounds):
        for policy in ("fair", "fifo") if i % 2 == 0 else ("fifo", "fair"):
            runs[policy].append(measure(mix, seconds / rounds, policy, config))
    fair = run_figures(mix, runs["fair"], config.anticipate_s)
    fifo = run_figures(mix, runs["fifo"], config.anticipate_s)
    for run in (fair, fifo):
        del run["turns"]  # each turn's times: for tests, not for the bench's line
    greedy = all(load.gap == 0 for load in mix.values())
    checks = targets(fair, config.tier_grace_s)
    checks["idle_while_waiting_within_2pct"] = (
        fair["idle_while_waiting"] <= 0.02 if greedy else None
    )
    if fair["handoff_p50_ms"] is not None and fifo["handoff_p50_ms"] is not None:
        checks["handoff_p50_within_10pct"] = fair["handoff_p50_ms"] <= 1.1 * fifo["handoff_p50_ms"]
    return {
        **fair,
        "targets": checks,
        **{f"reference_{k}": v for k, v in fifo.items()},
        "reference_targets": targets(fifo, config.tier_grace_s),
        "fair_better": better(fair, fifo),
    }

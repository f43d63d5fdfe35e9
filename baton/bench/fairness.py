"""`baton bench fairness`: skewed tenants on one GPU under the `fair` policy and under FIFO.

The load runs on the agent's own lease table (`agent.core.leases`, the policy exactly as the
agent runs it) with an injected clock, so a fixed span of GPU time is replayed in a moment and
both policies see the same load; the policy's cost on a real handoff is `bench handoff` run
with each policy in the same run.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from agent.core.fair import FairConfig, FairShare
from agent.core.leases import LeaseTable
from baton.bench.handoff import percentile


@dataclass(frozen=True)
class Load:
    """One tenant's demand: its duty, tier, turn length and idle time between turns (s)."""

    duty: int
    turn: float
    gap: float = 0.0
    tier: int = 0


MIXES: dict[str, dict[str, Load]] = {
    "skewed": {
        "greedy": Load(duty=30, turn=0.5),
        "light-a": Load(duty=20, turn=0.2, gap=0.2),
        "light-b": Load(duty=20, turn=0.2, gap=0.2),
        "batch": Load(duty=10, turn=0.5),
        "trainer": Load(duty=20, turn=0.3, gap=0.3, tier=1000),
    },
    "long-turns": {
        "greedy": Load(duty=50, turn=1.0),
        "short-a": Load(duty=10, turn=0.1, gap=0.4),
        "short-b": Load(duty=10, turn=0.1, gap=0.4),
        "short-c": Load(duty=10, turn=0.1, gap=0.4),
    },
    "equal": {name: Load(duty=25, turn=0.3) for name in ("a", "b", "c", "d")},
    "trainer-batch": {
        "trainer": Load(duty=50, turn=0.4, gap=0.4, tier=1000),
        "batch": Load(duty=50, turn=0.5),
    },
}
"""Tenant mixes: skewed (one greedy, two light, a batch tenant, a high-tier trainer), one
greedy tenant with long turns beside short ones, equal tenants, the RL trainer beside batch."""
MIX = MIXES["skewed"]
"""The default mix, whose figures are the bench's top-level fields."""


def simulate(mix: dict[str, Load], seconds: float, policy: str | FairShare) -> dict[str, Any]:
    """Run `mix` on one GPU for `seconds` of injected time: held seconds and waits per tenant."""
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
        if holder is None:
            for waiter in table.pick():
                lease = table.grant(waiter.waiter_id)
                waits[lease.tenant_id].append(now[0] - since.pop(lease.tenant_id))
                holder = (lease.tenant_id, lease.lease_id, now[0] + mix[lease.tenant_id].turn)
        now[0] = min([*wake.values(), holder[2] if holder else seconds, seconds])
        if holder is not None and holder[2] <= now[0]:
            name, lease_id, _ = holder
            table.release(lease_id)
            held[name] += mix[name].turn
            wake[name] = now[0] + mix[name].gap
            holder = None
    for name, start in since.items():
        waits[name].append(seconds - start)
    return {"held": held, "waits": waits}


def _figures(mix: dict[str, Load], run: dict[str, Any], seconds: float) -> dict[str, Any]:
    tenants = {}
    deviations = []
    entitled, capped = _entitled(mix, run, seconds)
    for name, load in mix.items():
        measured = run["held"][name] / seconds
        demand = load.turn / (load.turn + load.gap)
        tenants[name] = {
            "tier": load.tier,
            "entitled_share": round(entitled[name], 4),
            "demand_share": round(demand, 4),
            "asks_its_share": name not in capped,
            "measured_share": round(measured, 4),
            "p99_wait_ms": round(_p99(run["waits"][name]) * 1000, 3),
        }
        if name not in capped:  # the target binds tenants that ask for at least their share
            deviations.append(abs(measured - entitled[name]))
    shares = [run["held"][n] / seconds / entitled[n] for n in mix if entitled[n] > 0]
    jain = sum(shares) ** 2 / (len(shares) * sum(s * s for s in shares)) if shares else 1.0
    top = max(load.tier for load in mix.values())
    lower = [load.turn for load in mix.values() if load.tier < top]
    high = [w for n, load in mix.items() if load.tier == top for w in run["waits"][n]]
    return {
        "tenants": tenants,
        "max_share_deviation": round(max(deviations, default=0.0), 4),
        "jain_index": round(jain, 4),
        "starved": sorted(n for n in mix if run["held"][n] == 0),
        "p99_wait_ms": round(_p99(high) * 1000, 3) if lower else None,
        "lower_tier_turn_ms": max(lower) * 1000 if lower else None,
    }


def _p99(samples: list[float]) -> float:
    return percentile(samples, 0.99) if samples else 0.0


def _entitled(
    mix: dict[str, Load], run: dict[str, Any], seconds: float
) -> tuple[dict[str, float], set[str]]:
    """Each tenant's share of the GPU time the higher tiers left (tiers are strict), split in
    its tier by duty, max-min fair: a tenant asking less than its part is entitled to what it
    asks (returned among the capped) and the rest goes to the others by duty."""
    out: dict[str, float] = {}
    capped: set[str] = set()
    for tier in sorted({load.tier for load in mix.values()}, reverse=True):
        above = sum(run["held"][n] for n, load in mix.items() if load.tier > tier) / seconds
        left, open_ = 1.0 - above, {n for n, load in mix.items() if load.tier == tier}
        while open_:
            weights = sum(mix[n].duty for n in open_)
            part = {n: left * mix[n].duty / weights for n in open_}
            light = {n for n in open_ if _demand(mix[n]) < part[n]}
            if not light:
                out.update(part)
                break
            for name in light:
                out[name] = _demand(mix[name])
                left -= out[name]
            capped |= light
            open_ -= light
    return out, capped


def _demand(load: Load) -> float:
    return load.turn / (load.turn + load.gap)


def targets(figures: dict[str, Any], grace_s: float | None) -> dict[str, bool | None]:
    """The issue's targets on one policy's figures (None where a target does not apply)."""
    high = figures["p99_wait_ms"]
    bound = None if high is None else figures["lower_tier_turn_ms"] + (grace_s or 0.0) * 1000
    return {
        "share_within_5_points": figures["max_share_deviation"] <= 0.05,
        "no_starvation": not figures["starved"],
        "high_tier_wait_within_turn_plus_grace": None if bound is None else high <= bound,
    }


def _better(fair: dict[str, Any], fifo: dict[str, Any]) -> bool:
    """Fair is better on a mix: no worse on any figure and strictly better on one."""
    pairs = [(fair["max_share_deviation"], fifo["max_share_deviation"])]
    pairs.append((-fair["jain_index"], -fifo["jain_index"]))
    pairs.append((len(fair["starved"]), len(fifo["starved"])))
    if fair["p99_wait_ms"] is not None:
        pairs.append((fair["p99_wait_ms"], fifo["p99_wait_ms"]))
    return all(a <= b + 1e-3 for a, b in pairs) and any(a < b - 1e-3 for a, b in pairs)


def run_fairness_bench(
    seconds: float = 600.0,
    handoff_iterations: int = 500,
    config: FairConfig | None = None,
    mixes: list[str] | None = None,
) -> dict[str, Any]:
    """The fair policy against FIFO on the same load, for each mix (the first one's figures at
    the top level); handoff p50 of each policy (same run); the targets and, per mix, whether
    the fair policy was better."""
    from baton.bench.handoff import run_handoff_bench

    config = config or FairConfig()
    names = mixes or list(MIXES)
    unknown = [n for n in names if n not in MIXES]
    if unknown:
        raise ValueError(f"unknown mix {', '.join(unknown)}; the mixes are {', '.join(MIXES)}")
    per_mix: dict[str, dict[str, Any]] = {}
    for name in names:
        mix = MIXES[name]
        fair = _figures(mix, simulate(mix, seconds, FairShare(config)), seconds)
        fifo = _figures(mix, simulate(mix, seconds, "fifo"), seconds)
        per_mix[name] = {
            **fair,
            "targets": targets(fair, config.tier_grace_s),
            **{f"reference_{k}": v for k, v in fifo.items()},
            "reference_targets": targets(fifo, config.tier_grace_s),
            "fair_better": _better(fair, fifo),
        }
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

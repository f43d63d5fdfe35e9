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


MIX: dict[str, Load] = {
    "greedy": Load(duty=30, turn=0.5),
    "light-a": Load(duty=20, turn=0.2, gap=0.2),
    "light-b": Load(duty=20, turn=0.2, gap=0.2),
    "batch": Load(duty=10, turn=0.5),
    "trainer": Load(duty=20, turn=0.3, gap=0.3, tier=1000),
}
"""One greedy tenant, two light ones, a batch tenant that fills gaps, and a high-tier trainer."""


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
    for name, load in mix.items():
        measured = run["held"][name] / seconds
        entitled = _entitled(mix, run, seconds, name)
        demand = load.turn / (load.turn + load.gap)
        tenants[name] = {
            "tier": load.tier,
            "entitled_share": round(entitled, 4),
            "demand_share": round(demand, 4),
            "measured_share": round(measured, 4),
            "p99_wait_ms": round(percentile(run["waits"][name], 0.99) * 1000, 3),
        }
        if demand >= entitled:  # the target binds tenants that ask for at least their share
            deviations.append(abs(measured - entitled))
    shares = [run["held"][n] / seconds / _entitled(mix, run, seconds, n) for n in mix]
    jain = sum(shares) ** 2 / (len(shares) * sum(s * s for s in shares))
    top = max(load.tier for load in mix.values())
    high = [w for n, load in mix.items() if load.tier == top for w in run["waits"][n]]
    return {
        "tenants": tenants,
        "max_share_deviation": round(max(deviations, default=0.0), 4),
        "jain_index": round(jain, 4),
        "starved": sorted(n for n in mix if run["held"][n] == 0),
        "p99_wait_ms": round(percentile(high, 0.99) * 1000, 3),
        "lower_tier_turn_ms": max(load.turn for load in mix.values() if load.tier < top) * 1000,
    }


def _entitled(mix: dict[str, Load], run: dict[str, Any], seconds: float, name: str) -> float:
    """A tenant's duty's share of its tier, of the GPU time the higher tiers left (tiers are
    strict: a higher tier takes what it asks for)."""
    tier = mix[name].tier
    above = sum(run["held"][n] for n, load in mix.items() if load.tier > tier) / seconds
    peers = sum(load.duty for load in mix.values() if load.tier == tier)
    return mix[name].duty / peers * (1.0 - above)


def run_fairness_bench(
    seconds: float = 600.0, handoff_iterations: int = 500, config: FairConfig | None = None
) -> dict[str, Any]:
    """The fair policy against FIFO on the same load; handoff p50 of each (same run)."""
    from baton.bench.handoff import run_handoff_bench

    config = config or FairConfig()
    fair = _figures(MIX, simulate(MIX, seconds, FairShare(config)), seconds)
    fifo = _figures(MIX, simulate(MIX, seconds, "fifo"), seconds)
    out: dict[str, Any] = {
        **fair,
        "seconds": seconds,
        "min_share": config.min_share,
        "credit_s": config.credit_s,
        "tier_grace_s": config.tier_grace_s,
        **{f"reference_{k}": v for k, v in fifo.items()},
    }
    if handoff_iterations > 0:
        fair_handoff = run_handoff_bench(handoff_iterations, queue_policy="fair")
        fifo_handoff = run_handoff_bench(handoff_iterations, queue_policy="fifo")
        out["handoff_p50_ms"] = fair_handoff["handoff_p50_ms"]
        out["handoff_p99_ms"] = fair_handoff["handoff_p99_ms"]
        out["reference_handoff_p50_ms"] = fifo_handoff["handoff_p50_ms"]
        out["reference_handoff_p99_ms"] = fifo_handoff["handoff_p99_ms"]
        out["handoff_iterations"] = handoff_iterations
    return out

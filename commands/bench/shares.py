"""What each tenant of a fairness mix is owed, and the figures and targets of one run.

Shared by the replay (`commands.bench.fairness`) and the process-level run
(`commands.bench.fairness_procs`), which measure the same mixes in different ways.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from commands.bench.handoff import percentile

RETURN_S = 0.001
"""A tenant's time away between its yield and its next request beyond its own gap: the yield's
answer reaches the client, then its next request reaches the agent (the replay's delay)."""


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
    "duty-above-half": {
        "large": Load(duty=60, turn=0.05),
        "medium": Load(duty=30, turn=0.05),
        "small": Load(duty=10, turn=0.05),
    },
    "tenfold": {"long": Load(duty=50, turn=0.2), "short": Load(duty=50, turn=0.02)},
    "tenfold-gaps": {
        "long": Load(duty=50, turn=0.2, gap=0.005),
        "short": Load(duty=50, turn=0.02, gap=0.005),
    },
}
"""Tenant mixes: skewed (one greedy, two light, a batch tenant, a high-tier trainer), one
greedy tenant with long turns beside short ones, equal tenants, the RL trainer beside batch,
one duty above one half, turn lengths tenfold apart (greedy, and 5 ms off the GPU between)."""
MIX = MIXES["skewed"]
"""The default mix, whose figures are the bench's top-level fields."""


def figures(
    mix: dict[str, Load], run: dict[str, Any], seconds: float, window_s: float
) -> dict[str, Any]:
    """Shares entitled and measured, fairness and waits of one run (`held` and `waits` per
    tenant, and `away` where it was measured) of `seconds`; `window_s` is the agent's
    anticipation window."""
    tenants = {}
    deviations = []
    entitled, capped = _entitled(mix, run, seconds, window_s)
    for name, load in mix.items():
        measured = run["held"][name] / seconds
        demand = demand_share(mix, name, window_s)
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
    mix: dict[str, Load], run: dict[str, Any], seconds: float, window_s: float
) -> tuple[dict[str, float], set[str]]:
    """Each tenant's share of the GPU time the higher tiers left (tiers are strict), split in
    its tier by duty, max-min fair: a tenant asking less than its part is entitled to what it
    asks (returned among the capped) and the rest goes to the others by duty. A tenant the GPU
    waits for (`kept_for`) asks for all of it and computes `turn / (turn + away)` of its part."""
    out: dict[str, float] = {}
    capped: set[str] = set()
    for tier in sorted({load.tier for load in mix.values()}, reverse=True):
        above = sum(run["held"][n] for n, load in mix.items() if load.tier > tier) / seconds
        left, open_ = 1.0 - above, {n for n, load in mix.items() if load.tier == tier}
        while open_:
            weights = sum(mix[n].duty for n in open_)
            part = {n: left * mix[n].duty / weights for n in open_}
            light = {n for n in open_ if demand_share(mix, n, window_s) < part[n]}
            if not light:
                away = run.get("away", {})
                out.update(
                    {n: p * computes(mix[n], window_s, away.get(n)) for n, p in part.items()}
                )
                break
            for name in light:
                out[name] = demand_share(mix, name, window_s)
                left -= out[name]
            capped |= light
            open_ -= light
    return out, capped


def kept_for(load: Load, window_s: float) -> bool:
    """Whether the GPU waits for the tenant between its turns: it is back within the window."""
    return load.gap + RETURN_S <= window_s


def computes(load: Load, window_s: float, away: float | None = None) -> float:
    """The part of the GPU time it is charged for that a tenant computes: the GPU waits out its
    gaps when it is owed, charged to it (`agent.core.anticipation`). `away`: its time off the
    GPU per turn as measured (else its gap and `RETURN_S`)."""
    if not kept_for(load, window_s):
        return 1.0
    return load.turn / (load.turn + (load.gap + RETURN_S if away is None else away))


def demand_share(mix: dict[str, Load], name: str, window_s: float) -> float:
    """The share of the GPU `name` asks for (the demand rule, docs/fairness.md): all of it when
    the GPU waits for it; else a turn per turn, gap and the longest other turn in progress when
    it comes back (turns are not preempted)."""
    load = mix[name]
    if kept_for(load, window_s):
        return 1.0
    longest = max((other.turn for n, other in mix.items() if n != name), default=0.0)
    return load.turn / (load.turn + load.gap + (longest if load.gap > 0 else 0.0))


def targets(figures: dict[str, Any], grace_s: float | None) -> dict[str, bool | None]:
    """The targets on one policy's figures (None where a target does not apply). The high tier
    waits at most one lower-tier turn, the grace, and (where the run measured one) a handover:
    `handover_allowance_ms`."""
    high = figures["p99_wait_ms"]
    slack = (grace_s or 0.0) * 1000 + figures.get("handover_allowance_ms", 0.0)
    bound = None if high is None else figures["lower_tier_turn_ms"] + slack
    return {
        "share_within_5_points": figures["max_share_deviation"] <= 0.05,
        "no_starvation": not figures["starved"],
        "high_tier_wait_within_turn_plus_grace": None if bound is None else high <= bound,
    }


def better(fair: dict[str, Any], fifo: dict[str, Any]) -> bool:
    """Fair is better on a mix: no worse on any figure and strictly better on one."""
    pairs = [(fair["max_share_deviation"], fifo["max_share_deviation"])]
    pairs.append((-fair["jain_index"], -fifo["jain_index"]))
    pairs.append((len(fair["starved"]), len(fifo["starved"])))
    if fair["p99_wait_ms"] is not None:
        pairs.append((fair["p99_wait_ms"], fifo["p99_wait_ms"]))
    return all(a <= b + 1e-3 for a, b in pairs) and any(a < b - 1e-3 for a, b in pairs)

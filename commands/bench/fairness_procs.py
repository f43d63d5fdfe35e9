"""The process-level run of `baton bench fairness`: a real agent and tenant processes.

The agent (fake backend) runs in this process with the policy under test; each tenant of a mix
is its own process, the plain loop `while ...: with baton.turn(): step()` through the client
(`step` sleeps the turn's length, then the tenant is away its gap). Shares come from the
tenants' own clocks (`time.perf_counter`, CLOCK_MONOTONIC, one clock for every process on the
machine), beside the agent's own accounting of the same turns.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import shutil
import sys
import tempfile
import time
from typing import Any, NamedTuple

from agent.core.fair import FairConfig
from baton.contract.names import fake_gpu_uuid
from commands.bench.handoff import _spawn, percentile
from commands.bench.shares import Load, figures

GPU = fake_gpu_uuid(0)

Turn = tuple[float, float, float]
"""`(requested, granted, yielded)` of one turn, from `perf_counter`."""


class Run(NamedTuple):
    """What one run of a mix under one policy saw: each tenant's turns and time kept, the
    span every tenant ran through (`start` to `stop`), and the agent's accounting."""

    turns: dict[str, list[Turn]]
    kept: dict[str, float]
    start: float
    stop: float
    accounting: dict[tuple[str, str], float]


def run_mix(
    mix: dict[str, Load], seconds: float, policy: str, fair: FairConfig, client: str = "blocking"
) -> dict[str, Any]:
    """Run the mix's tenants (`Baton`, or `AsyncBaton` with `client="async"`) against a fresh
    agent for `seconds`; the shares' figures, the GPU's idle time while someone waits, the
    handoffs, and the agent's accounting beside the tenants' clocks."""
    return run_figures(mix, [measure(mix, seconds, policy, fair, client)], fair.anticipate_s)


def measure(
    mix: dict[str, Load], seconds: float, policy: str, fair: FairConfig, client: str = "blocking"
) -> Run:
    """One run of the mix's tenant processes against a fresh agent, as it was seen."""
    return asyncio.run(_run(mix, seconds, policy, fair, client))


async def _run(
    mix: dict[str, Load], seconds: float, policy: str, fair: FairConfig, client: str
) -> Run:
    from agent.assembly import AgentConfig, build_agent
    from agent.parking.setup import ParkingOptions

    workdir = tempfile.mkdtemp(dir="/tmp", prefix="baton-fairness-")
    socket = f"{workdir}/agent.sock"
    config = AgentConfig(
        socket=socket,
        state_dir=f"{workdir}/state",
        http_host="127.0.0.1",
        http_port=0,
        queue_policy=policy,
        fair=fair,
        parking=ParkingOptions(backend="fake", fake_gpus="1x1024", fake_dir=f"{workdir}/gpus"),
    )
    agent = build_agent(config)
    await agent.start()
    try:
        argvs = [[*_argv(socket, n, load, seconds), "--client", client] for n, load in mix.items()]
        reports = await _spawn("commands.bench.fairness_procs", argvs, seconds)
        accounting = dict(agent.service.metrics.accounting.by_gpu)
    finally:
        await agent.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    turns = {name: [tuple(t) for t in r["turns"]] for name, r in zip(mix, reports, strict=True)}
    kept = {name: r["kept"] for name, r in zip(mix, reports, strict=True)}
    start = max(r["start"] for r in reports)
    stop = min(r["stop"] for r in reports)
    return Run(turns, kept, start, stop, accounting)


def _argv(socket: str, name: str, load: Load, seconds: float) -> list[str]:
    return [
        "--socket", socket, "--name", name, "--duty", str(load.duty), "--tier", str(load.tier),
        "--turn", str(load.turn), "--gap", str(load.gap), "--seconds", str(seconds),
    ]  # fmt: skip


def run_figures(mix: dict[str, Load], runs: list[Run], window_s: float) -> dict[str, Any]:
    """The figures of one or more runs of the same mix and policy, taken together: shares of
    their spans added up, waits and handoffs of all of them."""
    span = sum(run.stop - run.start for run in runs)
    held = {
        n: sum(_clip(g, y, r.start, r.stop) for r in runs for _, g, y in r.turns[n]) for n in mix
    }
    waits = {n: [g - q for r in runs for q, g, _ in r.turns[n]] for n in mix}
    own = {n: sum(y - g for r in runs for _, g, y in r.turns[n]) for n in mix}
    kept = {n: sum(r.kept[n] for r in runs) for n in mix}
    leased = {n: own[n] + kept[n] for n in mix}  # its gaps within a kept lease are its too
    charged = {n: sum(r.accounting.get((GPU, f"local/{n}"), 0.0) for r in runs) for n in mix}
    away = {n: _away([r.turns[n] for r in runs], charged[n] - leased[n]) for n in mix}
    out = figures(mix, {"held": held, "waits": waits, "away": away}, span, window_s)
    passed = [handed for run in runs for handed in handoffs_to(run.turns)]
    errors = []
    for name, tenant in out["tenants"].items():
        tenant["tenant_gpu_seconds"] = round(own[name], 4)
        tenant["agent_gpu_seconds"] = round(charged[name], 4)
        tenant["kept_gap_seconds"] = round(kept[name], 4)
        tenant["away_ms"] = round(away[name] * 1000, 3)
        mine = [gap for to, gap in passed if to == name]
        tenant["handoff_p50_ms"] = round(percentile(mine, 0.5) * 1000, 3) if mine else None
        errors.append(abs(charged[name] - leased[name]) / leased[name] if leased[name] else 0.0)
    gaps = [gap for _, gap in passed]
    idle = sum(idle_while_waiting(run.turns, run.start, run.stop) for run in runs)
    out["accounting_error"] = round(max(errors, default=0.0), 4)
    out["idle_while_waiting"] = round(idle / span, 4)
    out["handoff_p50_ms"] = round(percentile(gaps, 0.5) * 1000, 3) if gaps else None
    out["handoffs"] = len(gaps)
    if out["lower_tier_turn_ms"] is not None:
        # A high tier waits out a lower turn as it was held, and a handover as the others' were
        # (its own left out: a slow one is not its own excuse).
        top = max(load.tier for load in mix.values())
        lower = [y - g for n in mix if mix[n].tier < top for r in runs for _, g, y in r.turns[n]]
        others = [gap for to, gap in passed if mix[to].tier < top]
        if lower:  # (none held: the nominal turn stands, and the starvation shows)
            out["lower_tier_turn_ms"] = round(max(lower) * 1000, 3)
        out["handover_allowance_ms"] = round(percentile(others, 0.99) * 1000, 3) if others else 0.0
    out["seconds"] = round(span, 3)
    out["turns"] = {n: [t for run in runs for t in run.turns[n]] for n in mix}
    return out


def _away(runs: list[list[Turn]], unseen: float) -> float:
    """A tenant's time off the GPU per turn as it was charged: from its yield to its next
    request (its gap and the yield's round trip), and the part of each turn the agent counted
    but the tenant did not see (the grant's and the yield's way between them; `unseen` in all,
    over the turns of every run in `runs`)."""
    returns = [b[0] - a[2] for turns in runs for a, b in itertools.pairwise(sorted(turns))]
    mean = sum(returns) / len(returns) if returns else 0.0
    return mean + max(0.0, unseen) / max(1, sum(map(len, runs)))


def _clip(granted: float, yielded: float, start: float, stop: float) -> float:
    return max(0.0, min(yielded, stop) - max(granted, start))


def idle_while_waiting(turns: dict[str, list[Turn]], start: float, stop: float) -> float:
    """Seconds within [start, stop] when no tenant held the GPU and one was waiting for it."""
    edges: list[tuple[float, int, int]] = []  # (time, change in holders, change in waiters)
    for ts in turns.values():
        for requested, granted, yielded in ts:
            edges += [(requested, 0, 1), (granted, 1, -1), (yielded, -1, 0)]
    idle, holders, waiters, last = 0.0, 0, 0, start
    for at, dh, dw in sorted(edges):
        if holders == 0 and waiters > 0:
            idle += _clip(last, at, start, stop)
        holders, waiters, last = holders + dh, waiters + dw, at
    return idle


def handoffs_to(turns: dict[str, list[Turn]]) -> list[tuple[str, float]]:
    """Yield→grant gaps where the turn passed to another tenant that was already waiting, each
    with the tenant it passed to."""
    ordered = sorted((g, y, r, n) for n, ts in turns.items() for r, g, y in ts)
    gaps = []
    for (_, yielded, _, before), (granted, _, requested, name) in itertools.pairwise(ordered):
        if name != before and requested < yielded:
            gaps.append((name, granted - yielded))
    return gaps


class Kept:
    """A tenant's time off the GPU while it kept its lease (`KeepTurn`): from a turn's end to
    the start of the next on the same lease, which the agent counts as the tenant's."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._last: tuple[str, float] = ("", 0.0)

    def turn(self, lease_id: str, granted: float, yielded: float) -> None:
        """A turn on `lease_id` from `granted` to `yielded`."""
        last_id, ended = self._last
        if lease_id == last_id:
            self.seconds += granted - ended
        self._last = (lease_id, yielded)


def _tenant(args: argparse.Namespace) -> dict[str, Any]:
    from agent.client import Baton

    baton = Baton(args.socket, [GPU], name=args.name, gpu_duty=args.duty, priority=args.tier)
    baton.connect()
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.perf_counter()
    stop = start + args.seconds
    turns: list[Turn] = []
    kept = Kept()
    while (requested := time.perf_counter()) < stop:
        with baton.turn() as lease:
            granted = time.perf_counter()
            time.sleep(args.turn)  # the step
            turns.append((requested, granted, time.perf_counter()))
            kept.turn(lease.lease_id, *turns[-1][1:])
        if args.gap:
            time.sleep(args.gap)  # off the GPU: loading data, logging, scoring
    baton.close()
    return {"start": start, "stop": stop, "turns": turns, "kept": kept.seconds}


async def _async_tenant(args: argparse.Namespace) -> dict[str, Any]:
    from agent.client import AsyncBaton

    baton = AsyncBaton(args.socket, [GPU], name=args.name, gpu_duty=args.duty, priority=args.tier)
    await baton.connect()
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    start = time.perf_counter()
    stop = start + args.seconds
    turns: list[Turn] = []
    kept = Kept()
    while (requested := time.perf_counter()) < stop:
        async with baton.turn() as lease:
            granted = time.perf_counter()
            await asyncio.sleep(args.turn)  # the step
            turns.append((requested, granted, time.perf_counter()))
            kept.turn(lease.lease_id, *turns[-1][1:])
        if args.gap:
            await asyncio.sleep(args.gap)
    await baton.close()
    return {"start": start, "stop": stop, "turns": turns, "kept": kept.seconds}


def main() -> None:
    """Entry point of a tenant process of the process-level run."""
    parser = argparse.ArgumentParser()
    for name in ("--socket", "--name"):
        parser.add_argument(name, required=True)
    for name in ("--duty", "--tier"):
        parser.add_argument(name, type=int, required=True)
    for name in ("--turn", "--gap", "--seconds"):
        parser.add_argument(name, type=float, required=True)
    parser.add_argument("--client", choices=["blocking", "async"], default="blocking")
    args = parser.parse_args()
    run = asyncio.run(_async_tenant(args)) if args.client == "async" else _tenant(args)
    print(json.dumps(run), flush=True)


if __name__ == "__main__":
    main()

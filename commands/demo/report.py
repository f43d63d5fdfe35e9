"""The demo's figures (the `baton bench duty` JSON) and its closing table."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from commands.demo.analysis import idle_waits, on_gpu, percentile, switches
from commands.demo.runner import DemoConfig, PhaseResult


def integrity_ok(*phases: PhaseResult) -> bool:
    """Every tenant finished, verified every turn after its first, and found no mismatch."""
    return all(
        not t.error and not t.mismatches and t.steps > 0 and t.verified == t.steps - 1
        for phase in phases
        for t in phase.tenants
    )


def summarize(config: DemoConfig, alone: PhaseResult, shared: PhaseResult) -> dict[str, Any]:
    """The bench fields, then figures that explain them."""
    baseline = [alone.cycle_duty(g) for g in alone.gpus]
    tenant_duty = sum(baseline) / len(baseline)
    ideal = min(1.0, config.tenants * tenant_duty)
    gpu = shared.gpus[0]
    shared_holds = on_gpu(shared.holds, gpu)
    timesliced = shared.duty(gpu)
    waits = idle_waits(shared_holds, shared.requested(), shared.t0, shared.t1)
    idle = shared.wall_s * (1 - timesliced)
    moves = shared.moves
    return {
        "tenants": config.tenants,
        "tenant_duty": round(tenant_duty, 4),
        "ideal_duty": round(ideal, 4),
        "baseline_duty": round(tenant_duty, 4),
        "timesliced_duty": round(timesliced, 4),
        "efficiency": round(timesliced / ideal, 4) if ideal else 0.0,
        "switches": switches(shared_holds, shared.t0, shared.t1),
        "moved_bytes": int(sum(m["bytes"] for m in moves.values())),
        "integrity_ok": integrity_ok(alone, shared),
        "target_duty": config.duty,
        "baseline_duty_per_gpu": [round(d, 4) for d in baseline],
        "baseline_duty_window": round(sum(alone.duty(g) for g in alone.gpus) / len(baseline), 4),
        "duration_s": config.duration_s,
        "warmup_s": config.warmup_s,
        "gpu_memory_mib": config.gpu_memory_mib,
        "footprints_mib": [config.footprint(i) for i in range(config.tenants)],
        "pcie_gbps": config.pcie_gbps,
        "parks": int(moves["park"]["count"]),
        "restores": int(moves["restore"]["count"]),
        "move_s": round(sum(m["seconds"] for m in moves.values()), 3),
        "idle_s": round(idle, 3),
        "idle_while_waited_s": round(sum(waits), 3),
        "idle_unwanted_s": round(max(0.0, idle - sum(waits)), 3),
        "grant_wait_p50_ms": round(percentile(waits, 0.5) * 1000, 2),
        "grant_wait_p99_ms": round(percentile(waits, 0.99) * 1000, 2),
        "steps_alone": sum(t.steps_in(alone.t0, alone.t1) for t in alone.tenants),
        "steps_shared": sum(t.steps_in(shared.t0, shared.t1) for t in shared.tenants),
    }


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def _mib(mib: int) -> str:
    """A footprint in MiB, as GiB once it is that large."""
    return f"{mib / 1024:.1f} GiB" if mib >= 1024 else f"{mib} MiB"


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def print_report(
    console: Console, config: DemoConfig, alone: PhaseResult, shared: PhaseResult
) -> dict[str, Any]:
    """Print the per tenant and per GPU tables; returns the summary they show."""
    s = summarize(config, alone, shared)
    tenants = Table(title="Tenants", title_justify="left")
    for col in ("tenant", "footprint", "steps alone", "steps shared", "turns verified", "data"):
        tenants.add_column(col, justify="left" if col in ("tenant", "data") else "right")
    for a, b in zip(alone.tenants, shared.tenants, strict=True):
        ok = not (a.error or b.error or a.mismatches or b.mismatches)
        verdict = "intact" if ok else "; ".join([a.error, b.error, *a.mismatches, *b.mismatches])
        tenants.add_row(
            a.name,
            _mib(config.footprint(alone.tenants.index(a))),
            str(a.steps_in(alone.t0, alone.t1)),
            str(b.steps_in(shared.t0, shared.t1)),
            str(a.verified + b.verified),
            f"[green]{verdict}[/]" if ok else f"[red]{verdict}[/]",
        )
    gpus = Table(title="GPUs (duty = busy ÷ wall, from the agent's events)", title_justify="left")
    for col in ("phase", "GPU", "duty", "switches", "parks", "restores", "moved"):
        gpus.add_column(col, justify="left" if col in ("phase", "GPU") else "right")
    for phase in (alone, shared):
        for i, g in enumerate(phase.gpus):
            m = phase.moves
            totals = [str(int(m["park"]["count"])), str(int(m["restore"]["count"]))]
            moved = _gib(m["park"]["bytes"] + m["restore"]["bytes"])
            gpu_holds = on_gpu(phase.holds, g)
            gpus.add_row(
                phase.label, g, _pct(round(phase.duty(g), 4)),
                str(switches(gpu_holds, phase.t0, phase.t1)),
                *([*totals, moved] if i == 0 else ["", "", ""]),
            )  # fmt: skip
    console.print(tenants)
    console.print(gpus)
    verdict = "[green]intact[/]" if s["integrity_ok"] else "[red]CORRUPTED OR INCOMPLETE[/]"
    how = f"at {config.pcie_gbps:g} GB/s modelled"
    if config.backend == "app":
        how = "in the tenants' own callbacks"
    console.print(
        f"{config.tenants} tenants at {_pct(s['tenant_duty'])} duty alone: 1 shared GPU busy "
        f"{_pct(s['timesliced_duty'])} of the time, ideal {_pct(s['ideal_duty'])} → "
        f"[bold]{_pct(s['efficiency'])}[/] of ideal; data {verdict}.\n"
        f"Shared GPU idle {s['idle_s']:.2f} s: {s['idle_while_waited_s']:.2f} s while a tenant "
        f"waited for it (p50 {s['grant_wait_p50_ms']:.0f} ms a turn; parks and restores took "
        f"{s['move_s']:.2f} s {how}), "
        f"{s['idle_unwanted_s']:.2f} s while every tenant was off the GPU."
    )
    return s

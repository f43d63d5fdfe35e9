"""`baton demo`, `baton bench duty` and `baton bench train` (registered by `commands.cli`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from commands.cli.options import AsJson, echo_figures, interruptible

if TYPE_CHECKING:
    from commands.demo.runner import DemoConfig

Tenants = Annotated[int, typer.Option(min=1, max=7, help="Synthetic RL tenants.")]
Duty = Annotated[float, typer.Option(min=0.01, max=1.0, help="GPU share of each tenant alone.")]
Cycle = Annotated[float, typer.Option(min=0.05, help="Mean seconds of one GPU + off-GPU step.")]
Duration = Annotated[float, typer.Option(min=1.0, help="Seconds each of the two runs is measured.")]
Warmup = Annotated[
    float, typer.Option(min=0.0, help="Seconds each run goes before it is measured.")
]
GpuMemory = Annotated[int, typer.Option(min=1, help="Simulated GPU memory, MiB.")]
Footprints = Annotated[
    str, typer.Option(help="Device memory per tenant, MiB: one value, or one per tenant (a,b,c).")
]
Pcie = Annotated[float, typer.Option(help="Modelled host-device bandwidth, GB/s; 0 = unmodelled.")]
Scale = Annotated[float, typer.Option(help="Real bytes per simulated byte of device memory.")]
Jitter = Annotated[
    float, typer.Option(min=0.0, max=0.9, help="Phase lengths vary by up to ± this fraction.")
]
Seed = Annotated[int, typer.Option(help="Seed of the phase lengths' variation.")]
OutDir = Annotated[Path, typer.Option(help="Where the timeline PNG and trace JSON go.")]
TenantKind = Annotated[
    str,
    typer.Option(
        help="synthetic (sleeps and byte patterns), train (real SFT and GRPO in PyTorch) or trl "
        "(TRL's SFTTrainer and GRPOTrainer); train and trl are parked by the app backend, and "
        "--duty, --cycle and the memory flags do not apply to them."
    ),
]

TRAINING = {"train": "GRPO and SFT in PyTorch", "trl": "TRL's GRPOTrainer and SFTTrainer"}
"""The real training tenant kinds, as the demo says what they do."""


def _train(config: DemoConfig, kind: str) -> DemoConfig:
    """The demo with real training tenants (`train` or `trl`), on a GPU that holds all but one."""
    import importlib.util
    import math
    from dataclasses import replace

    try:
        from commands.demo.train import Spec, TrainMix, shared_gpu_mib
    except ImportError as e:
        raise typer.BadParameter(f"--tenant-kind {kind} needs torch ({e})") from None
    specs: list[Spec] = list(TrainMix(tenants=config.tenants, steps=0).specs())
    if kind == "trl":
        if importlib.util.find_spec("trl") is None:
            raise typer.BadParameter("--tenant-kind trl needs TRL: pip install 'baton-gpu[trl]'")
        from commands.demo.trl import TrlMix

        specs = list(TrlMix(tenants=config.tenants, steps=0).specs())
    sizes = tuple(math.ceil(s.footprint_mib()) for s in specs)
    # As with the synthetic tenants: all but one fit, so switches park and restore.
    gpu = shared_gpu_mib(specs, len(specs) - 1) if len(specs) > 1 else sizes[0]
    return replace(config, tenant_kind=kind, gpu_memory_mib=gpu, footprints_mib=sizes)


def _config(
    tenants: int, duty: float, cycle: float, duration: float, warmup: float, gpu_memory: int,
    footprints: str, pcie_gbps: float, scale: float, jitter: float, seed: int,
) -> DemoConfig:  # fmt: skip
    """The run's settings from the flags; `footprints` is `MIB` or `MIB,MIB,...`."""
    import math

    from commands.demo.runner import DemoConfig

    try:
        sizes = tuple(int(x) for x in footprints.split(",") if x.strip())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) <= 0:
        raise typer.BadParameter(f"--footprints {footprints!r}: give MiB, e.g. 6144 or 6144,4096")
    if len(sizes) not in (1, tenants):
        raise typer.BadParameter(
            f"--footprints {footprints!r}: give one value, or one per tenant ({tenants})"
        )
    for flag, value in (("--cycle", cycle), ("--duration", duration), ("--warmup", warmup)):
        if not math.isfinite(value):
            raise typer.BadParameter(f"{flag} {value:g}: give a finite number of seconds")
    if not 0 <= pcie_gbps < math.inf:
        raise typer.BadParameter(f"--pcie-gbps {pcie_gbps:g}: give GB/s, or 0 for unmodelled")
    if not 0 < scale < math.inf:
        raise typer.BadParameter(f"--scale {scale:g}: give real bytes per simulated byte, above 0")
    if max(sizes) > gpu_memory:
        raise typer.BadParameter(
            f"a footprint of {max(sizes)} MiB exceeds --gpu-memory {gpu_memory}"
        )
    return DemoConfig(
        tenants=tenants, duty=duty, cycle_s=cycle, duration_s=duration, warmup_s=warmup,
        gpu_memory_mib=gpu_memory, footprints_mib=sizes, pcie_gbps=pcie_gbps, scale=scale,
        jitter=jitter, seed=seed,
    )  # fmt: skip


def demo(
    tenants: Tenants = 3,
    duty: Duty = 0.4,
    cycle: Cycle = 1.5,
    duration: Duration = 18.0,
    warmup: Warmup = 2.0,
    gpu_memory: GpuMemory = 16384,
    footprints: Footprints = "6144",
    pcie_gbps: Pcie = 55.0,
    scale: Scale = 1 / 4096,
    jitter: Jitter = 0.1,
    seed: Seed = 7,
    out_dir: OutDir = Path("baton-demo"),
    tenant_kind: TenantKind = "synthetic",
) -> None:
    """Turn-taking on this machine: RL tenants alone on their own fake GPUs, then sharing one."""
    import asyncio

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from commands.demo.report import print_report
    from commands.demo.runner import DemoError, run_comparison
    from commands.demo.timeline import write_timeline

    config = _config(
        tenants, duty, cycle, duration, warmup, gpu_memory, footprints, pcie_gbps, scale,
        jitter, seed,
    )  # fmt: skip
    console = Console()
    if tenant_kind != "synthetic" and tenant_kind not in TRAINING:
        raise typer.BadParameter(f"--tenant-kind {tenant_kind!r}: synthetic, train or trl")
    _check_out_dir(out_dir)
    what = f"each busy on its GPU {duty:.0%} of a {cycle:g} s step"
    sizes = f"{gpu_memory} MiB, footprints {footprints} MiB, {pcie_gbps:g} GB/s modelled"
    if tenant_kind in TRAINING:
        config = _train(config, tenant_kind)
        what = f"training for real ({TRAINING[tenant_kind]} on the CPU)"
        sizes = f"{config.gpu_memory_mib} MiB GPU, app backend"
    _check_room("baton demo", config)
    console.print(
        f"{tenants} tenants, {what}; {tenants} GPUs alone, then one GPU shared, each run "
        f"measured for {duration:g} s after {warmup:g} s of warm-up ({sizes})."
    )
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[turns]}"))
    with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
        tasks = {
            label: progress.add_task(text, total=warmup + duration, turns="", start=False)
            for label, text in (
                ("alone", f"alone: {tenants} GPUs"),
                ("shared", "shared: 1 GPU"),
            )
        }

        def tick(label: str, elapsed: float, grants: int) -> None:
            progress.start_task(tasks[label])
            progress.update(tasks[label], completed=elapsed, turns=f"{grants} turns")

        try:
            alone, shared = asyncio.run(run_comparison(config, tick))
        except DemoError as e:
            console.print(f"[red]baton demo: {e}[/]")
            raise typer.Exit(1) from None
    print_report(console, config, alone, shared)
    try:
        png, trace = write_timeline(out_dir, [alone, shared], "Who held the GPU when")
    except OSError as e:
        console.print(f"[red]baton demo: cannot write the timeline under {out_dir}: {e}[/]")
        raise typer.Exit(1) from None
    console.print(f"Timeline: {png} (picture), {trace} (open in https://ui.perfetto.dev)")


def _check_out_dir(out_dir: Path) -> None:
    """Make `out_dir` and write a file in it, or a `BadParameter` naming --out-dir: before the
    run, so that its result is not lost to a directory the timeline cannot go to."""
    import tempfile

    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as e:
        why = "not a directory" if isinstance(e, FileExistsError) else e.strerror
        raise typer.BadParameter(
            f"{out_dir}: the timeline cannot be written there ({why})", param_hint="--out-dir"
        ) from None


def _check_room(command: str, config: DemoConfig) -> None:
    """End the command in one line (exit status 2) where the run's bytes would not fit."""
    from commands.demo.runner import check_room

    try:
        check_room(config)
    except ValueError as e:
        typer.echo(f"{command}: {e}", err=True)
        raise typer.Exit(2) from None


def bench_duty(
    tenants: Tenants = 3,
    duty: Duty = 0.3,
    cycle: Cycle = 1.5,
    duration: Duration = 20.0,
    warmup: Warmup = 3.0,
    gpu_memory: GpuMemory = 16384,
    footprints: Footprints = "6144",
    pcie_gbps: Pcie = 55.0,
    scale: Scale = 1 / 4096,
    jitter: Jitter = 0.1,
    seed: Seed = 7,
    as_json: AsJson = False,
) -> None:
    """Duty cycle of tenants alone on their GPUs against all of them sharing one."""
    import asyncio

    from commands.demo.report import summarize
    from commands.demo.runner import DemoError, run_comparison

    config = _config(
        tenants, duty, cycle, duration, warmup, gpu_memory, footprints, pcie_gbps, scale,
        jitter, seed,
    )  # fmt: skip
    _check_room("baton bench duty", config)
    try:
        alone, shared = asyncio.run(run_comparison(config))
    except DemoError as e:
        typer.echo(f"baton bench duty: {e}", err=True)
        raise typer.Exit(1) from None
    echo_figures(summarize(config, alone, shared), as_json)


Opt = typer.Option


def bench_train(
    tenants: Annotated[
        int | None,
        Opt(min=2, max=7, help="Tenants, GRPO and SFT in turn (default 3; 4 in --mix short)."),
    ] = None,
    steps: Annotated[int | None, Opt(min=2, help="Training steps of each tenant.")] = None,
    device: Annotated[str, Opt(help="Where tenants train: cpu, or cuda.")] = "cpu",
    d_model: Annotated[int | None, Opt(min=8, help="Model width.")] = None,
    layers: Annotated[int | None, Opt(min=1, help="Transformer blocks.")] = None,
    sft_batch: Annotated[int | None, Opt(min=1, help="SFT pairs per step.")] = None,
    grpo_batch: Annotated[
        int | None,
        Opt(min=1, help="GRPO prompts per step (completions, 4 a prompt, with --framework trl)."),
    ] = None,
    group: Annotated[int | None, Opt(min=2, help="GRPO completions per prompt.")] = None,
    grpo_off_s: Annotated[
        float | None, Opt(min=0.0, help="GRPO's modelled off-device wait per step, s.")
    ] = None,
    sft_off_s: Annotated[
        float | None, Opt(min=0.0, help="SFT's modelled off-device wait per step, s.")
    ] = None,
    framework: Annotated[
        str, Opt(help="torch (our own loops) or trl (TRL's SFTTrainer and GRPOTrainer).")
    ] = "torch",
    mix: Annotated[
        str,
        Opt(
            help="With --framework trl: default, or short (4 jobs of ~0.1 s steps, nothing "
            "off-turn, a GPU that holds one: every turn a handover)."
        ),
    ] = "default",
    as_json: AsJson = False,
) -> None:
    """Real SFT and GRPO tenants alone, then sharing one device: duty, GB/s, bit-exactness.

    Unset sizes take `commands.demo.train.TrainMix`'s defaults (`commands.demo.trl.TrlMix`'s with
    `--framework trl`, where all but --layers and --group apply, --d-model as the models' hidden
    size).
    """
    if framework not in ("torch", "trl"):
        raise typer.BadParameter(f"--framework {framework!r}: torch or trl")
    if device != "cpu" and device.partition(":")[0] != "cuda":
        raise typer.BadParameter(f"{device!r}: cpu, or cuda (cuda:N)", param_hint="--device")
    if framework == "torch" and mix != "default":
        raise typer.BadParameter("--mix applies to --framework trl only")
    if framework == "trl" and (layers is not None or group is not None):
        raise typer.BadParameter("--layers and --group apply to --framework torch only")
    try:
        from commands.bench.train import run
        from commands.demo.train import TrainMix, TrainRunError
    except ImportError as e:
        typer.echo(f"baton bench train needs torch: pip install 'baton-gpu[torch]' ({e})", err=True)
        raise typer.Exit(1) from None
    given: dict[str, Any] = {
        "steps": steps, "d_model": d_model, "layers": layers, "sft_batch": sft_batch,
        "grpo_batch": grpo_batch, "group": group, "grpo_off_s": grpo_off_s,
        "sft_off_s": sft_off_s,
    }  # fmt: skip
    config: Any = TrainMix(
        tenants=tenants or 3, device=device, **{k: v for k, v in given.items() if v is not None}
    )
    if framework == "trl":
        import importlib.util

        from commands.demo.trl import trl_mix

        if importlib.util.find_spec("trl") is None:
            typer.echo("--framework trl needs TRL: pip install 'baton-gpu[trl]'", err=True)
            raise typer.Exit(1)
        try:
            config = trl_mix(
                mix, tenants=tenants, steps=steps, device=device, grpo_off_s=grpo_off_s,
                sft_off_s=sft_off_s, sft_batch=sft_batch, grpo_batch=grpo_batch, hidden=d_model,
            )  # fmt: skip
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
    try:
        figures = run(config)
    except TrainRunError as e:
        typer.echo(f"baton bench train: {e}", err=True)
        raise typer.Exit(1) from None
    echo_figures(figures, as_json)


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add `baton demo`, `baton bench duty` and `baton bench train`."""
    app.command("demo")(interruptible("baton demo", demo))
    bench.command("duty")(interruptible("baton bench duty", bench_duty))
    bench.command("train")(interruptible("baton bench train", bench_train))

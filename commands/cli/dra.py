"""`baton dra`: the DRA driver's command (registered by `commands.cli`)."""

from __future__ import annotations

from typing import Annotated

import typer

from baton.contract import names
from baton.contract.shutdown import DEFAULT_GRACE_S
from commands.cli.options import (
    HOST_MEMORY_BUDGET_DEFAULT,
    IGNORED_XIDS_DEFAULT,
    PORT_MAX,
    FakeGpus,
    HostMemoryBudget,
    IgnoredXids,
    Kubeconfig,
    LogLevel,
    NodeName,
    SlotsPerGpu,
    check_dir,
    check_grace,
    node_inputs,
    node_options,
    setup_logging,
)


def dra(
    node_name: NodeName,
    kubeconfig: Kubeconfig = None,
    plugins_dir: Annotated[
        str, typer.Option(envvar="BATON_DRA_PLUGINS_DIR", help="Where the endpoint socket goes.")
    ] = names.KUBELET_PLUGINS_DIR,
    registry_dir: Annotated[
        str,
        typer.Option(envvar="BATON_DRA_REGISTRY_DIR", help="The kubelet's plugins_registry."),
    ] = names.KUBELET_PLUGINS_REGISTRY_DIR,
    cdi_dir: Annotated[
        str, typer.Option(envvar="BATON_CDI_DIR", help="Where per-claim CDI specs are written.")
    ] = names.CDI_SPEC_DIR,
    state_dir: Annotated[
        str, typer.Option(envvar="BATON_DRA_STATE_DIR", help="The record of prepared claims.")
    ] = names.DRA_STATE_DIR,
    slots_per_gpu: SlotsPerGpu = names.DEFAULT_SLOTS_PER_GPU,
    fake_gpus: FakeGpus = None,
    host_memory_budget: HostMemoryBudget = HOST_MEMORY_BUDGET_DEFAULT,
    vendor_cdi: Annotated[
        str,
        typer.Option(
            envvar="BATON_VENDOR_CDI",
            help="Vendor CDI kind whose <kind>=<uuid> devices are returned too (nvidia.com/gpu);"
            " '' = set NVIDIA_VISIBLE_DEVICES instead.",
        ),
    ] = "",
    runtime_cdi: Annotated[
        str,
        typer.Option(
            envvar="BATON_RUNTIME_CDI",
            help="auto (from the node's runtime version), on, or off: whether the runtime "
            "applies CDI; claims are refused without it.",
        ),
    ] = "auto",
    metrics_host: Annotated[str, typer.Option(envvar="BATON_DRA_METRICS_HOST")] = "0.0.0.0",
    metrics_port: Annotated[
        int,
        typer.Option(
            envvar="BATON_DRA_METRICS_PORT", min=0, max=PORT_MAX, help="0 = any free port."
        ),
    ] = names.PORT_DRA,
    ignored_xids: IgnoredXids = IGNORED_XIDS_DEFAULT,
    shutdown_grace: Annotated[
        float,
        typer.Option(envvar="BATON_DRA_SHUTDOWN_GRACE", help="Seconds a prepare gets on SIGTERM."),
    ] = DEFAULT_GRACE_S,
    log_level: LogLevel = "INFO",
) -> None:
    """Run the DRA driver: publish GPUs as shareable devices, prepare claims with CDI."""
    from pathlib import Path

    from baton.contract.draapi import DraApi
    from baton.contract.shutdown import StopSignal
    from dra.cdi import kind_problem
    from dra.daemon import DraStartError, DraStoppedAtStart, Driver, Settings
    from nodegpu.node import node_fields

    check_dir(plugins_dir, "--plugins-dir (BATON_DRA_PLUGINS_DIR)", names.KUBELET_PLUGINS_DIR)
    registry = "--registry-dir (BATON_DRA_REGISTRY_DIR)"
    check_dir(registry_dir, registry, names.KUBELET_PLUGINS_REGISTRY_DIR)
    check_dir(cdi_dir, "--cdi-dir (BATON_CDI_DIR)", names.CDI_SPEC_DIR)
    check_dir(state_dir, "--state-dir (BATON_DRA_STATE_DIR)", names.DRA_STATE_DIR)
    check_grace(shutdown_grace)
    setup_logging(log_level)
    if runtime_cdi not in ("auto", "on", "off"):
        raise typer.BadParameter("--runtime-cdi must be auto, on or off")
    problem = kind_problem(vendor_cdi) if vendor_cdi else None
    if problem:
        raise typer.BadParameter(problem, param_hint="--vendor-cdi (BATON_VENDOR_CDI)")
    found = node_inputs("baton dra", node_options(locals()))
    settings = Settings(
        **node_fields(found.settings),
        plugins_dir=Path(plugins_dir),
        registry_dir=Path(registry_dir),
        cdi_dir=Path(cdi_dir),
        state_dir=Path(state_dir),
        vendor_cdi=vendor_cdi or None,
        runtime_cdi=runtime_cdi,
    )
    stop = StopSignal().install()
    api_client = found.api_client
    try:
        driver = Driver(
            settings,
            found.gpus,
            found.fake,
            api=DraApi(api_client, node_name),
            api_client=api_client,
            stop=stop,
        )
        driver.run_until(stop.event, lambda: stop.received)
    except DraStoppedAtStart as err:
        typer.echo(f"baton dra: {err}", err=True)
    except (DraStartError, ValueError) as err:
        typer.echo(f"baton dra: {err}", err=True)
        raise typer.Exit(1) from None


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add `baton dra`."""
    app.command("dra")(dra)

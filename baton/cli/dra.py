"""`baton dra`: the DRA driver's command (registered by `baton.cli`)."""

from __future__ import annotations

from typing import Annotated

import typer

from baton.cli.options import Kubeconfig, LogLevel, setup_logging
from baton.contract import names
from baton.contract.shutdown import DEFAULT_GRACE_S
from deviceplugin.annotate import DEFAULT_HOST_MEMORY_BUDGET
from deviceplugin.health import DEFAULT_IGNORED_XIDS


def dra(
    node_name: Annotated[
        str, typer.Option(envvar=names.ENV_NODE_NAME, help="This node's name (downward API).")
    ],
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
    slots_per_gpu: Annotated[
        int, typer.Option(envvar="BATON_SLOTS_PER_GPU", min=1, help="Tenants per GPU.")
    ] = names.DEFAULT_SLOTS_PER_GPU,
    fake_gpus: Annotated[
        str | None,
        typer.Option(
            envvar=names.ENV_FAKE_GPUS,
            help="Simulated GPUs: COUNTxMiB (2x81920), MiB,MiB,... or a JSON/YAML file.",
        ),
    ] = None,
    host_memory_budget: Annotated[
        str,
        typer.Option(
            envvar=names.ENV_HOST_MEMORY_BUDGET, help="Parked-memory budget: MiB or % of MemTotal."
        ),
    ] = DEFAULT_HOST_MEMORY_BUDGET,
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
        int, typer.Option(envvar="BATON_DRA_METRICS_PORT", help="0 = any free port.")
    ] = names.PORT_DRA,
    ignored_xids: Annotated[
        str, typer.Option(envvar="BATON_IGNORED_XIDS", help="XIDs that do not fail a GPU.")
    ] = ",".join(map(str, DEFAULT_IGNORED_XIDS)),
    shutdown_grace: Annotated[
        float,
        typer.Option(envvar="BATON_DRA_SHUTDOWN_GRACE", help="Seconds a prepare gets on SIGTERM."),
    ] = DEFAULT_GRACE_S,
    log_level: LogLevel = "INFO",
) -> None:
    """Run the DRA driver: publish GPUs as shareable devices, prepare claims with CDI."""
    from pathlib import Path

    from baton.contract.kube import KubeConfigError, load_api_client
    from baton.contract.meminfo import MEMINFO
    from baton.contract.shutdown import StopSignal
    from deviceplugin.annotate import host_memory_budget_mib
    from deviceplugin.gpus import DiscoveryError, discover
    from deviceplugin.health import parse_xid_list
    from dra.daemon import DraStartError, Driver, Settings
    from dra.kubeapi import KubeDraApi

    setup_logging(log_level)
    if runtime_cdi not in ("auto", "on", "off"):
        raise typer.BadParameter("--runtime-cdi must be auto, on or off")
    try:
        gpus, fake = discover(fake_gpus, node_name)
        budget = host_memory_budget_mib(host_memory_budget, Path(MEMINFO).read_text())
        xids = parse_xid_list(ignored_xids)
        api_client = load_api_client(kubeconfig)
    except (DiscoveryError, KubeConfigError, ValueError) as err:
        typer.echo(f"baton dra: {err}", err=True)
        raise typer.Exit(1) from err
    settings = Settings(
        node_name=node_name,
        plugins_dir=Path(plugins_dir),
        registry_dir=Path(registry_dir),
        cdi_dir=Path(cdi_dir),
        state_dir=Path(state_dir),
        slots_per_gpu=slots_per_gpu,
        host_memory_budget_mib=budget,
        vendor_cdi=vendor_cdi or None,
        runtime_cdi=runtime_cdi,
        metrics_host=metrics_host,
        metrics_port=metrics_port,
        ignored_xids=xids,
        shutdown_grace=shutdown_grace,
    )
    stop = StopSignal().install()
    try:
        driver = Driver(
            settings, gpus, fake, api=KubeDraApi(api_client, node_name), api_client=api_client
        )
        driver.run_until(stop.event, lambda: stop.received)
    except (DraStartError, ValueError) as err:
        typer.echo(f"baton dra: {err}", err=True)
        raise typer.Exit(1) from None


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add `baton dra`."""
    app.command("dra")(dra)

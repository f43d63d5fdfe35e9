"""`baton` subcommands of the deviceplugin (registered by `baton.cli`)."""

from __future__ import annotations

from typing import Annotated

import typer

from baton.cli.options import AsJson, Kubeconfig, LogLevel, echo_figures, setup_logging
from baton.contract import names
from baton.contract.shutdown import DEFAULT_GRACE_S
from deviceplugin.annotate import DEFAULT_HOST_MEMORY_BUDGET
from deviceplugin.health import DEFAULT_IGNORED_XIDS
from deviceplugin.reconcile import DEFAULT_INTERVAL_S


def deviceplugin(
    node_name: Annotated[
        str, typer.Option(envvar=names.ENV_NODE_NAME, help="This node's name (downward API).")
    ],
    kubeconfig: Kubeconfig = None,
    device_plugin_dir: Annotated[
        str, typer.Option(envvar="BATON_DEVICE_PLUGIN_DIR", help="Holds kubelet.sock.")
    ] = names.KUBELET_DEVICE_PLUGIN_DIR,
    slots_per_gpu: Annotated[
        int, typer.Option(envvar="BATON_SLOTS_PER_GPU", min=1, help="Slot devices per GPU.")
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
    cdi: Annotated[
        bool, typer.Option(envvar="BATON_CDI", help="Hand out CDI device names, not the env var.")
    ] = False,
    metrics_host: Annotated[
        str, typer.Option(envvar="BATON_DEVICE_PLUGIN_METRICS_HOST")
    ] = "0.0.0.0",
    metrics_port: Annotated[
        int, typer.Option(envvar="BATON_DEVICE_PLUGIN_METRICS_PORT", help="0 = any free port.")
    ] = names.PORT_DEVICE_PLUGIN,
    ignored_xids: Annotated[
        str, typer.Option(envvar="BATON_IGNORED_XIDS", help="XIDs that do not fail a GPU.")
    ] = ",".join(map(str, DEFAULT_IGNORED_XIDS)),
    pod_resources_socket: Annotated[
        str,
        typer.Option(
            envvar="BATON_POD_RESOURCES_SOCKET",
            help="The kubelet's PodResources API, read to reconcile pod annotations ('' = off).",
        ),
    ] = names.KUBELET_POD_RESOURCES_SOCKET,
    reconcile_interval: Annotated[
        float,
        typer.Option(
            envvar="BATON_RECONCILE_INTERVAL",
            min=0.1,
            help="Seconds between reconciliations besides the ones after each Allocate.",
        ),
    ] = DEFAULT_INTERVAL_S,
    shutdown_grace: Annotated[
        float,
        typer.Option(
            envvar="BATON_DEVICE_PLUGIN_SHUTDOWN_GRACE", help="Seconds an Allocate gets on SIGTERM."
        ),
    ] = DEFAULT_GRACE_S,
    log_level: LogLevel = "INFO",
) -> None:
    """Run the kubelet device plugin: advertise time-sliced GPU slots, hand each pod its GPUs."""
    from pathlib import Path

    from baton.contract.kube import KubeConfigError, load_api_client
    from baton.contract.meminfo import MEMINFO
    from baton.contract.shutdown import StopSignal
    from deviceplugin.annotate import host_memory_budget_mib
    from deviceplugin.daemon import Daemon, Settings
    from deviceplugin.errors import DevicePluginStartError
    from deviceplugin.gpus import DiscoveryError, discover
    from deviceplugin.health import parse_xid_list

    setup_logging(log_level)
    try:
        gpus, fake = discover(fake_gpus, node_name)
        budget = host_memory_budget_mib(host_memory_budget, Path(MEMINFO).read_text())
        xids = parse_xid_list(ignored_xids)
        api_client = load_api_client(kubeconfig)
    except (DiscoveryError, KubeConfigError, ValueError) as err:
        typer.echo(f"baton deviceplugin: {err}", err=True)
        raise typer.Exit(1) from err
    settings = Settings(
        node_name=node_name,
        plugin_dir=Path(device_plugin_dir),
        slots_per_gpu=slots_per_gpu,
        host_memory_budget_mib=budget,
        cdi=cdi,
        metrics_host=metrics_host,
        metrics_port=metrics_port,
        ignored_xids=xids,
        shutdown_grace=shutdown_grace,
        pod_resources_socket=Path(pod_resources_socket) if pod_resources_socket else None,
        reconcile_interval_s=reconcile_interval,
    )
    stop = StopSignal().install()
    try:
        daemon = Daemon(settings, gpus, fake, api_client=api_client)
        daemon.run_until(stop.event, lambda: stop.received)
    except DevicePluginStartError as err:
        typer.echo(f"baton deviceplugin: {err}", err=True)
        raise typer.Exit(1) from None


def bench_allocate(
    iterations: Annotated[int, typer.Option(min=1, help="Pods admitted, one Allocate each.")] = 500,
    pods: Annotated[int, typer.Option(min=0, help="Running pods already on the node.")] = 200,
    api: Annotated[
        str, typer.Option(help="memory (in-process pods) or fake (fake API server, real client).")
    ] = "memory",
    as_json: AsJson = False,
) -> None:
    """Allocate latency seen by the kubelet over the plugin's socket (target: p99 < 10 ms)."""
    from baton.bench.allocate import run

    if api not in ("memory", "fake"):
        raise typer.BadParameter("--api must be memory or fake")
    echo_figures(run(iterations, pods, api), as_json)


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add this component's commands to `baton` and its benchmarks to `baton bench`."""
    app.command("deviceplugin")(deviceplugin)
    bench.command("allocate")(bench_allocate)

"""`baton` subcommands of the deviceplugin (registered by `commands.cli`)."""

from __future__ import annotations

import math
import os
from typing import Annotated

import typer

from baton.contract import names
from baton.contract.shutdown import DEFAULT_GRACE_S
from commands.cli.options import (
    HOST_MEMORY_BUDGET_DEFAULT,
    IGNORED_XIDS_DEFAULT,
    PORT_MAX,
    AsJson,
    FakeGpus,
    HostMemoryBudget,
    IgnoredXids,
    Kubeconfig,
    LogLevel,
    NodeName,
    SlotsPerGpu,
    check_dir,
    check_grace,
    echo_figures,
    interruptible,
    node_inputs,
    node_options,
    setup_logging,
)
from deviceplugin.reconcile import DEFAULT_INTERVAL_S

POD_RESOURCES_ENV = "BATON_POD_RESOURCES_SOCKET"


def deviceplugin(
    node_name: NodeName,
    kubeconfig: Kubeconfig = None,
    device_plugin_dir: Annotated[
        str, typer.Option(envvar="BATON_DEVICE_PLUGIN_DIR", help="Holds kubelet.sock.")
    ] = names.KUBELET_DEVICE_PLUGIN_DIR,
    slots_per_gpu: SlotsPerGpu = names.DEFAULT_SLOTS_PER_GPU,
    fake_gpus: FakeGpus = None,
    host_memory_budget: HostMemoryBudget = HOST_MEMORY_BUDGET_DEFAULT,
    cdi: Annotated[
        bool, typer.Option(envvar="BATON_CDI", help="Hand out CDI device names, not the env var.")
    ] = False,
    metrics_host: Annotated[
        str, typer.Option(envvar="BATON_DEVICE_PLUGIN_METRICS_HOST")
    ] = "0.0.0.0",
    metrics_port: Annotated[
        int,
        typer.Option(
            envvar="BATON_DEVICE_PLUGIN_METRICS_PORT",
            min=0,
            max=PORT_MAX,
            help="0 = any free port.",
        ),
    ] = names.PORT_DEVICE_PLUGIN,
    ignored_xids: IgnoredXids = IGNORED_XIDS_DEFAULT,
    pod_resources_socket: Annotated[
        str | None,
        typer.Option(
            envvar=POD_RESOURCES_ENV,
            help="The kubelet's PodResources API, read to reconcile pod annotations ('' = off); "
            f"default {names.KUBELET_POD_RESOURCES_SOCKET}.",
        ),
    ] = None,
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

    from baton.contract.shutdown import StopSignal
    from deviceplugin.daemon import Daemon, Settings
    from deviceplugin.errors import DevicePluginStartError
    from nodegpu.node import node_fields

    check_dir(
        device_plugin_dir,
        "--device-plugin-dir (BATON_DEVICE_PLUGIN_DIR)",
        names.KUBELET_DEVICE_PLUGIN_DIR,
    )
    check_grace(shutdown_grace)
    if not math.isfinite(reconcile_interval):  # the periodic reconciliation would never come
        raise typer.BadParameter(
            f"{reconcile_interval}: must be a finite number of seconds",
            param_hint="--reconcile-interval",
        )
    if pod_resources_socket is None:  # click reads an empty env var as unset: '' is off there too
        pod_resources_socket = os.environ.get(POD_RESOURCES_ENV, names.KUBELET_POD_RESOURCES_SOCKET)
    setup_logging(log_level)
    found = node_inputs("baton deviceplugin", node_options(locals()))
    settings = Settings(
        **node_fields(found.settings),
        plugin_dir=Path(device_plugin_dir),
        cdi=cdi,
        pod_resources_socket=Path(pod_resources_socket) if pod_resources_socket else None,
        reconcile_interval_s=reconcile_interval,
    )
    stop = StopSignal().install()
    try:
        daemon = Daemon(settings, found.gpus, found.fake, api_client=found.api_client, stop=stop)
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
    from commands.bench.allocate import run

    if api not in ("memory", "fake"):
        raise typer.BadParameter("--api must be memory or fake")
    echo_figures(run(iterations, pods, api), as_json)


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add this component's commands to `baton` and its benchmarks to `baton bench`."""
    app.command("deviceplugin")(deviceplugin)
    bench.command("allocate")(interruptible("baton bench allocate", bench_allocate))

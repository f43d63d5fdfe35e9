"""`baton` subcommands of the extender (registered by `commands.cli`)."""

from __future__ import annotations

from typing import Annotated

import typer

from baton.contract import names
from baton.contract.shutdown import DEFAULT_GRACE_S
from commands.cli.options import (
    PORT_MAX,
    AsJson,
    Kubeconfig,
    LogLevel,
    check_grace,
    echo_figures,
    interruptible,
    setup_logging,
)
from extender.bind import BINDS_IN_FLIGHT

MAX_DUTY_LIMIT = 1000
"""The highest --max-duty, percent: summed duty of up to ten times one GPU's time."""


def extender(
    kubeconfig: Kubeconfig = None,
    host: Annotated[str, typer.Option(envvar="BATON_EXTENDER_HOST")] = "0.0.0.0",
    port: Annotated[
        int, typer.Option(envvar="BATON_EXTENDER_PORT", min=0, max=PORT_MAX)
    ] = names.PORT_EXTENDER,
    policy: Annotated[
        str, typer.Option(envvar="BATON_EXTENDER_POLICY", help="binpack, spread or complement.")
    ] = "binpack",
    max_duty: Annotated[
        float,
        typer.Option(envvar="BATON_EXTENDER_MAX_DUTY", help="Highest summed gpu-duty per GPU, %."),
    ] = 100.0,
    memory_headroom: Annotated[
        int,
        typer.Option(envvar="BATON_EXTENDER_MEMORY_HEADROOM", help="MiB kept free on every GPU."),
    ] = 0,
    tls_cert: Annotated[
        str | None, typer.Option(envvar="BATON_EXTENDER_TLS_CERT", help="Serve HTTPS.")
    ] = None,
    tls_key: Annotated[str | None, typer.Option(envvar="BATON_EXTENDER_TLS_KEY")] = None,
    tls_client_ca: Annotated[
        str | None,
        typer.Option(
            envvar="BATON_EXTENDER_TLS_CLIENT_CA",
            help="CA of kube-scheduler's client certificate: /bind needs one it signed.",
        ),
    ] = None,
    shutdown_grace: Annotated[
        float,
        typer.Option(
            envvar="BATON_EXTENDER_SHUTDOWN_GRACE", help="Seconds open requests get on SIGTERM."
        ),
    ] = DEFAULT_GRACE_S,
    binds_in_flight: Annotated[
        int,
        typer.Option(
            envvar="BATON_EXTENDER_BINDS_IN_FLIGHT",
            help="Binds that may wait on the API server at once; the rest queue in order.",
        ),
    ] = BINDS_IN_FLIGHT,
    dra: Annotated[
        bool,
        typer.Option(
            envvar="BATON_EXTENDER_DRA",
            help="Also watch ResourceClaims: filter and score pods placed through DRA.",
        ),
    ] = False,
    log_level: LogLevel = "INFO",
) -> None:
    """Run the kube-scheduler extender: filter, prioritize and bind Baton pods."""
    from baton.contract.kube import KubeConfigError
    from extender.main import ExtenderStartError, Options, run
    from extender.placement import Limits, Policy

    policies = [p.value for p in Policy]
    if policy not in policies:
        raise typer.BadParameter(
            f"{policy!r}; choose one of {', '.join(policies)}", param_hint="--policy"
        )
    if not 0 < max_duty <= MAX_DUTY_LIMIT:
        raise typer.BadParameter(
            f"{max_duty:g}: must be above 0 and at most {MAX_DUTY_LIMIT} (percent)",
            param_hint="--max-duty",
        )
    if memory_headroom < 0:
        raise typer.BadParameter("must be 0 or more MiB", param_hint="--memory-headroom")
    if binds_in_flight < 1:
        raise typer.BadParameter("must be 1 or more", param_hint="--binds-in-flight")
    check_grace(shutdown_grace)
    if bool(tls_cert) != bool(tls_key):
        raise typer.BadParameter("give both --tls-cert and --tls-key, or neither")
    if tls_client_ca and not tls_cert:
        raise typer.BadParameter(
            "needs --tls-cert and --tls-key: client certificates are asked for over HTTPS",
            param_hint="--tls-client-ca",
        )
    setup_logging(log_level)
    limits = Limits(Policy(policy), max_duty, memory_headroom)
    try:
        options = Options(
            kubeconfig,
            host,
            port,
            limits,
            tls_cert,
            tls_key,
            shutdown_grace,
            binds_in_flight,
            dra,
            tls_client_ca,
        )
        run(options)
    except (KubeConfigError, ExtenderStartError) as err:
        typer.echo(f"baton extender: {err}", err=True)
        raise typer.Exit(2) from None


def bench_extender(
    nodes: Annotated[int, typer.Option(min=1, help="Nodes in the synthetic cluster.")] = 5000,
    pods: Annotated[int, typer.Option(min=0, help="Tenant pods placed on them.")] = 10000,
    iterations: Annotated[int, typer.Option(min=10, help="Filter and prioritize calls.")] = 400,
    binds: Annotated[int, typer.Option(min=1, help="Bind calls.")] = 200,
    as_json: AsJson = False,
) -> None:
    """Filter, prioritize and bind latency and filter throughput over real HTTP."""
    from commands.bench.extender import run

    figures = run(nodes, pods, iterations, binds)
    if figures["pods_unplaced"]:
        typer.echo(
            f"baton bench extender: only {figures['pods']} of the {pods} pods asked (--pods) "
            f"were placed (each goes to one random node of the {nodes} and is left out if that "
            "node has no room); the figures are for a cluster of that many: give more --nodes or "
            "fewer --pods",
            err=True,
        )
    if figures["bind_p99_ms"] is None:
        typer.echo(
            f"baton bench extender: none of the {binds} pods to bind (--binds) passed filter on "
            "any node, so no bind was timed: give more --nodes or fewer --pods",
            err=True,
        )
    echo_figures(figures, as_json)


def bench_schedule(
    nodes: Annotated[
        int, typer.Option(min=1, help="Nodes made through the API, 8 GPUs each.")
    ] = 100,
    pods: Annotated[int, typer.Option(min=2, help="Pods for the throughput run.")] = 1000,
    latency_pods: Annotated[int, typer.Option(min=1, help="Pods for the latency run.")] = 200,
    rate: Annotated[float, typer.Option(min=0.1, help="Pods/s created in the latency run.")] = 20.0,
    rounds: Annotated[
        int, typer.Option(min=1, help="Throughput runs per profile, taking turns; medians.")
    ] = 3,
    path: Annotated[
        str,
        typer.Option(
            help="extender: the extender profile; dra: also the DRA overlay's profile, placing "
            "the same pods' shares as claims from ResourceSlices.",
        ),
    ] = "extender",
    as_json: AsJson = False,
) -> None:
    """Pods through the real kube-scheduler with the extender (and with `--path dra` through
    DRA), against a profile without Baton."""
    from commands.bench.schedule import PATHS, run
    from commands.localnode.binaries import find_binaries
    from commands.localnode.procs import LocalNodeError

    if path not in PATHS:
        typer.echo(f"baton bench schedule: --path must be one of {', '.join(PATHS)}", err=True)
        raise typer.Exit(2)
    if find_binaries() is None:
        typer.echo(
            "baton bench schedule: needs Kubernetes binaries (kube-apiserver, kube-scheduler, "
            "etcd): set BATON_KUBE_BIN_DIR",
            err=True,
        )
        raise typer.Exit(2)
    try:
        figures = run(nodes, pods, latency_pods, rate, rounds, path)
    except (LocalNodeError, TimeoutError, RuntimeError) as exc:
        typer.echo(f"baton bench schedule: {exc}", err=True)
        raise typer.Exit(1) from None
    echo_figures(figures, as_json)


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add this component's commands to `baton` and its benchmarks to `baton bench`."""
    app.command("extender")(extender)
    bench.command("extender")(interruptible("baton bench extender", bench_extender))
    bench.command("schedule")(interruptible("baton bench schedule", bench_schedule))

"""`baton coordinator` (registered by `commands.cli`)."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Annotated

import typer

from baton.contract import names
from commands.cli.options import (
    AsJson,
    Kubeconfig,
    LogLevel,
    check_address,
    check_name,
    echo_figures,
    interruptible,
    setup_logging,
)

POLICIES = ("fifo", "fair")


def coordinator(
    ctx: typer.Context,
    token_file: Annotated[
        str,
        typer.Option(
            envvar="BATON_COORDINATION_TOKEN_FILE",
            help="A file holding the token the agents expect (from a Secret).",
        ),
    ] = "",
    kubeconfig: Kubeconfig = None,
    namespace: Annotated[
        str, typer.Option(envvar="BATON_COORDINATOR_NAMESPACE", help="Where the Lease lives.")
    ] = names.NAMESPACE,
    lease: Annotated[
        str, typer.Option(envvar="BATON_COORDINATOR_LEASE", help="The Lease's name.")
    ] = names.COORDINATOR_LEASE,
    identity: Annotated[
        str,
        typer.Option(envvar="POD_NAME", help="This replica's name in the Lease (the host name)."),
    ] = "",
    pod_namespace: Annotated[
        str,
        typer.Option(envvar="POD_NAMESPACE", help="This replica's pod's namespace (to label it)."),
    ] = "",
    llmd_listen: Annotated[
        str,
        typer.Option(envvar="BATON_COORDINATOR_LLMD_LISTEN", help="llm-d's orchestrator API."),
    ] = f"0.0.0.0:{names.PORT_LLMD_ORCHESTRATOR}",
    http_listen: Annotated[
        str,
        typer.Option(
            envvar="BATON_COORDINATOR_HTTP_LISTEN",
            help="/healthz, /readyz (200 while leading), /metrics and /v1/status.",
        ),
    ] = f"0.0.0.0:{names.PORT_COORDINATOR}",
    queue_policy: Annotated[
        str, typer.Option(envvar="BATON_COORDINATOR_QUEUE_POLICY", help="fifo or fair.")
    ] = "fifo",
    lease_duration: Annotated[
        int, typer.Option(envvar="BATON_COORDINATOR_LEASE_DURATION", help="Seconds.")
    ] = 15,
    renew_deadline: Annotated[
        float, typer.Option(envvar="BATON_COORDINATOR_RENEW_DEADLINE", help="Seconds.")
    ] = 10.0,
    retry_period: Annotated[
        float, typer.Option(envvar="BATON_COORDINATOR_RETRY_PERIOD", help="Seconds.")
    ] = 2.0,
    prepare_timeout: Annotated[
        float,
        typer.Option(
            envvar="BATON_COORDINATOR_PREPARE_TIMEOUT",
            help="Seconds a node may take to make room for a job's turn.",
        ),
    ] = 60.0,
    allow_unidentified: Annotated[
        bool,
        typer.Option(
            envvar="BATON_COORDINATOR_ALLOW_UNIDENTIFIED",
            help="Let callers that are no identifiable pod drive the one namespace with their job.",
        ),
    ] = False,
    log_level: LogLevel = "INFO",
) -> None:
    """Run the cluster coordinator: one turn for a whole job across its pods and nodes."""
    from baton.contract.shutdown import StopSignal

    early = ctx.with_resource(StopSignal().caught())  # a stop signal is noted till it runs
    from baton.contract.kube import KubeConfigError
    from coordinator.daemon import CoordinatorConfig, CoordinatorStartError, run_coordinator
    from coordinator.lease import TimingError, check_timing

    if queue_policy not in POLICIES:
        raise typer.BadParameter(
            f"{queue_policy!r}; choose one of {', '.join(POLICIES)}", param_hint="--queue-policy"
        )
    try:
        flags = ("--lease-duration", "--renew-deadline", "--retry-period")
        check_timing(lease_duration, renew_deadline, retry_period, flags)
    except TimingError as err:
        raise typer.BadParameter(err.problem, param_hint=err.name) from None
    check_name(namespace, "--namespace (BATON_COORDINATOR_NAMESPACE)", "namespace", label=True)
    check_name(lease, "--lease (BATON_COORDINATOR_LEASE)", "Lease")
    check_address(llmd_listen, "--llmd-listen", grpc=True)
    check_address(http_listen, "--http-listen")
    if not 0 < prepare_timeout < math.inf:  # (NaN too; an endless prepare holds a job for good)
        raise typer.BadParameter(
            f"{prepare_timeout}: must be a finite number of seconds above 0",
            param_hint="--prepare-timeout",
        )
    if pod_namespace and not identity:  # its pod could not be labelled: no Service endpoint
        raise typer.BadParameter(
            f"{pod_namespace!r} names the pod's namespace, but not the pod: pass its name as "
            "--identity (POD_NAME) too, so that the leader labels its pod for the Service",
            param_hint="--pod-namespace",
        )
    if pod_namespace:  # the leader labels its pod: both name it
        check_name(pod_namespace, "--pod-namespace (POD_NAMESPACE)", "namespace", label=True)
        check_name(identity, "--identity (POD_NAME)", "pod")
    if not token_file:
        raise typer.BadParameter("the agents' token is required", param_hint="--token-file")
    try:
        token = Path(token_file).read_text().strip()
    except OSError as err:
        raise typer.BadParameter(
            f"cannot read {token_file} ({err.strerror})", param_hint="--token-file"
        ) from None
    if not token:
        raise typer.BadParameter(f"{token_file} is empty", param_hint="--token-file")
    setup_logging(log_level)
    config = CoordinatorConfig(
        token=token,
        kubeconfig=kubeconfig,
        namespace=namespace,
        lease_name=lease,
        identity=identity,
        llmd_listen=llmd_listen,
        http_listen=http_listen,
        queue_policy=queue_policy,
        lease_duration_s=lease_duration,
        renew_deadline_s=renew_deadline,
        retry_period_s=retry_period,
        prepare_timeout_s=prepare_timeout,
        allow_unidentified=allow_unidentified,
        pod_name=identity if pod_namespace else "",
        pod_namespace=pod_namespace,
    )
    try:
        asyncio.run(run_coordinator(config, early))
    except (KubeConfigError, CoordinatorStartError) as err:
        typer.echo(f"baton coordinator: {err}", err=True)
        raise typer.Exit(2) from None


def bench_gang(
    nodes: Annotated[int, typer.Option(help="Nodes every job spans (2 to 8).")] = 4,
    jobs: Annotated[int, typer.Option(help="Jobs taking turns on those nodes.")] = 2,
    turns: Annotated[
        int, typer.Option(help="Turns of each measured phase, all jobs together.")
    ] = 200,
    hold_ms: Annotated[
        float, typer.Option(help="Each job's hold in the efficiency phase (parks forced).")
    ] = 50.0,
    crossed: Annotated[
        int, typer.Option(help="Turns two jobs crossing on two nodes take, each acquire bounded.")
    ] = 1000,
    pin_agents: Annotated[
        bool,
        typer.Option(
            "--pin-agents/--float-agents",
            help="Node i's agent on CPU i of this machine (modulo its CPUs), as a node's agent "
            "has its node's CPUs; or every agent on any CPU.",
        ),
    ] = True,
    as_json: AsJson = False,
) -> None:
    """Jobs spanning several nodes through the coordinator, against agent processes and a real
    kube-apiserver: handoff (with the node-local one as the same run's reference), skew between
    nodes, efficiency with parks forced, and deadlocks over crossed turns."""
    from commands.bench.gang import GangSetup, run_gang_bench
    from commands.localnode.binaries import find_binaries
    from commands.localnode.procs import LocalNodeError

    setup = GangSetup(
        nodes=nodes, jobs=jobs, turns=turns, hold_ms=hold_ms, crossed=crossed, pin=pin_agents
    )
    try:
        setup.check()
    except ValueError as err:
        hint = next(w for w in ("nodes", "jobs", "turns", "hold-ms", "crossed") if w in str(err))
        raise typer.BadParameter(str(err), param_hint=f"--{hint}") from None
    if find_binaries() is None:
        typer.echo(
            "baton bench gang: needs Kubernetes binaries (kube-apiserver, etcd): "
            "set BATON_KUBE_BIN_DIR",
            err=True,
        )
        raise typer.Exit(2)
    try:
        figures = run_gang_bench(setup)
    except (LocalNodeError, TimeoutError, RuntimeError) as err:
        typer.echo(f"baton bench gang: {err}", err=True)
        raise typer.Exit(1) from None
    echo_figures(figures, as_json)


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add this component's commands to `baton` and its benchmarks to `baton bench`."""
    app.command("coordinator")(coordinator)
    bench.command("gang")(interruptible("baton bench gang", bench_gang))

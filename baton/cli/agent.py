"""`baton agent` and the agent's benchmarks (registered by `baton.cli`)."""

from __future__ import annotations

from typing import Annotated

import typer

from agent.parking.methods import CHOICES, CUDA, NONE, PLAIN, described
from baton.cli.options import AsJson, Kubeconfig, LogLevel, echo_figures, setup_logging
from baton.contract import names
from baton.contract.shutdown import DEFAULT_GRACE_S


def _queue_policy(queue_policy: str | None, deprecated: str | None) -> str:
    """`--queue-policy`, else the deprecated `--policy` (saying so once on stderr), else fifo."""
    if deprecated is not None:
        typer.echo(
            "baton agent: --policy (BATON_AGENT_POLICY) is deprecated; "
            "use --queue-policy (BATON_AGENT_QUEUE_POLICY)",
            err=True,
        )
    return queue_policy or deprecated or "fifo"


def agent(
    socket: Annotated[
        str, typer.Option(envvar=names.ENV_AGENT_SOCKET, help="gRPC unix socket.")
    ] = names.AGENT_SOCKET,
    state_dir: Annotated[
        str, typer.Option(envvar="BATON_AGENT_STATE_DIR", help="Durable state directory.")
    ] = names.AGENT_STATE_DIR,
    http_host: Annotated[str, typer.Option(envvar="BATON_AGENT_HTTP_HOST")] = "0.0.0.0",
    http_port: Annotated[
        int, typer.Option(envvar="BATON_AGENT_HTTP_PORT", help="Status/metrics; 0 = any.")
    ] = names.PORT_AGENT,
    debug_tcp_port: Annotated[
        int, typer.Option(envvar="BATON_AGENT_DEBUG_TCP_PORT", help="Also on 127.0.0.1; 0 = off.")
    ] = 0,
    queue_policy: Annotated[
        str | None,
        typer.Option(
            envvar="BATON_AGENT_QUEUE_POLICY",
            help="Who is served next: fifo, lrs (least recently served) or fair (weighted fair "
            "turns in priority tiers). Default fifo.",
        ),
    ] = None,
    fair_min_share: Annotated[
        float,
        typer.Option(
            envvar="BATON_AGENT_FAIR_MIN_SHARE",
            help="fair: share of a GPU a lower tier keeps while a higher one waits (0-0.5).",
        ),
    ] = 0.1,
    fair_credit: Annotated[
        float,
        typer.Option(
            envvar="BATON_AGENT_FAIR_CREDIT", help="fair: GPU-seconds an idle tenant may bank."
        ),
    ] = 10.0,
    fair_anticipate: Annotated[
        float,
        typer.Option(
            envvar="BATON_AGENT_FAIR_ANTICIPATE",
            help="fair: seconds a GPU is kept for an owed tenant that yielded and usually asks "
            "again within them (idle GPU time, charged to it, against the share of tenants with "
            "short turns and gaps); 0 = off.",
        ),
    ] = 0.01,
    tier_grace: Annotated[
        float,
        typer.Option(
            envvar="BATON_AGENT_TIER_GRACE",
            help="fair: seconds before a higher tier's waiter revokes a lower tier's holder "
            "(negative = never; it waits for the holder's yield).",
        ),
    ] = -1.0,
    policy: Annotated[
        str | None,
        typer.Option(
            envvar="BATON_AGENT_POLICY",
            hidden=True,
            help="Deprecated alias of --queue-policy.",
        ),
    ] = None,
    max_hold: Annotated[
        float, typer.Option(envvar="BATON_AGENT_MAX_HOLD", help="Seconds before revocation.")
    ] = 60.0,
    reconnect_grace: Annotated[
        float, typer.Option(envvar="BATON_AGENT_RECONNECT_GRACE", help="After a restart.")
    ] = 10.0,
    socket_mode: Annotated[
        str, typer.Option(envvar="BATON_AGENT_SOCKET_MODE", help="Octal mode of the sockets.")
    ] = "0660",
    backend: Annotated[
        str,
        typer.Option(
            envvar=names.ENV_AGENT_BACKEND,
            help=f"Parking: {described(CHOICES)}, or several (cuda,app: first = default).",
        ),
    ] = NONE,
    fake_gpus: Annotated[
        str,
        typer.Option(envvar=names.ENV_FAKE_GPUS, help="Simulated GPUs: COUNTxMiB or MiB,MiB,..."),
    ] = "2x81920",
    fake_scale: Annotated[
        float, typer.Option(envvar=names.ENV_FAKE_SCALE, help="Real bytes per simulated byte.")
    ] = 1 / 1024,
    fake_dir: Annotated[
        str, typer.Option(envvar=names.ENV_FAKE_GPU_DIR, help="Simulated device memory files.")
    ] = names.DEFAULT_FAKE_GPU_DIR,
    pcie_gbps: Annotated[
        float,
        typer.Option(envvar=names.ENV_PCIE_GBPS, help="Modelled GB/s of a fake move; 0 = off."),
    ] = 0.0,
    host_memory_budget: Annotated[
        int,
        typer.Option(envvar=names.ENV_HOST_MEMORY_BUDGET, help="MiB for parked memory; 0 = auto."),
    ] = 0,
    headroom: Annotated[
        int | None,
        typer.Option(
            envvar=names.ENV_HEADROOM,
            help="MiB kept free on each GPU (and needed free beyond a restore's bytes); "
            "default 1024 with --backend cuda, else 0.",
        ),
    ] = None,
    move_timeout: Annotated[
        float, typer.Option(envvar=names.ENV_MOVE_TIMEOUT, help="Seconds for a lock or callback.")
    ] = 5.0,
    driver_call_timeout: Annotated[
        float,
        typer.Option(
            envvar=names.ENV_DRIVER_CALL_TIMEOUT,
            help="cuda: seconds a driver call may take beyond its lock timeout or copy time.",
        ),
    ] = 10.0,
    slowest_copy_gbps: Annotated[
        float,
        typer.Option(
            envvar=names.ENV_SLOWEST_COPY_GBPS,
            help="cuda: the slowest GB/s a checkpoint or restore deadline allows for.",
        ),
    ] = 1.0,
    node_name: Annotated[
        str,
        typer.Option(
            envvar=names.ENV_NODE_NAME,
            help="In Kubernetes: watch this node's pods; also names the fake GPUs.",
        ),
    ] = "",
    allow_local_tenants: Annotated[
        bool,
        typer.Option(
            envvar="BATON_AGENT_ALLOW_LOCAL_TENANTS",
            help="With --node-name: let processes in no pod register as tenants too.",
        ),
    ] = False,
    kubeconfig: Kubeconfig = None,
    proc_root: Annotated[
        str, typer.Option(envvar="BATON_PROC_ROOT", help="The host's /proc (PID → pod).")
    ] = "/proc",
    shutdown_grace: Annotated[
        float,
        typer.Option(
            envvar="BATON_AGENT_SHUTDOWN_GRACE", help="Seconds in-flight RPCs get on SIGTERM."
        ),
    ] = DEFAULT_GRACE_S,
    llmd_listen: Annotated[
        str,
        typer.Option(
            envvar=names.ENV_LLMD_LISTEN,
            help="Also serve llm-d's time-slicing API here (HOST:PORT, plaintext); off if empty.",
        ),
    ] = "",
    llmd_group: Annotated[
        list[str] | None,
        typer.Option(
            envvar=names.ENV_LLMD_GROUPS,
            help="An llm-d group outside Kubernetes: NAME=GPU[,GPU...] (repeatable).",
        ),
    ] = None,
    log_level: LogLevel = "INFO",
) -> None:
    """Run the node agent: turn-taking leases on this node's GPUs."""
    import asyncio

    from agent.assembly import AgentConfig, AgentStartError, run_agent
    from agent.core.fair import FairConfig
    from agent.core.policy import QUEUE_POLICIES
    from agent.node.state import StateDirError
    from agent.parking.backends.base import BackendUnavailable
    from agent.parking.setup import ParkingOptions
    from agent.server.llmd.groups import Groups, GroupSpecError
    from baton.contract.kube import KubeConfigError

    setup_logging(log_level)
    if driver_call_timeout <= 0 or slowest_copy_gbps <= 0:
        raise typer.BadParameter("--driver-call-timeout and --slowest-copy-gbps must be above 0")
    order = _queue_policy(queue_policy, policy)
    if order not in QUEUE_POLICIES:
        choices = ", ".join(QUEUE_POLICIES)
        raise typer.BadParameter(f"unknown policy {order!r}; choose one of {choices}")
    try:
        grace = tier_grace if tier_grace >= 0 else None
        fair = FairConfig(fair_min_share, fair_credit, grace, anticipate_s=fair_anticipate)
    except ValueError as exc:
        hint = "--fair-anticipate" if "anticipate" in str(exc) else "--fair-min-share"
        raise typer.BadParameter(str(exc), param_hint=hint) from None
    try:
        Groups.from_specs(llmd_group or ())
    except GroupSpecError as exc:
        raise typer.BadParameter(str(exc), param_hint="--llmd-group") from None
    config = AgentConfig(
        socket=socket,
        state_dir=state_dir,
        http_host=http_host,
        http_port=http_port,
        debug_tcp_port=debug_tcp_port,
        queue_policy=order,
        fair=fair,
        max_hold=max_hold,
        reconnect_grace=reconnect_grace,
        socket_mode=int(socket_mode, 8),
        node_name=node_name,
        allow_local_tenants=allow_local_tenants,
        kubeconfig=kubeconfig,
        proc_root=proc_root,
        shutdown_grace=shutdown_grace,
        llmd_listen=llmd_listen,
        llmd_groups=tuple(llmd_group or ()),
        parking=ParkingOptions(
            backend=backend,
            fake_gpus=fake_gpus,
            node_name=node_name,
            fake_scale=fake_scale,
            fake_dir=fake_dir,
            pcie_gbps=pcie_gbps,
            host_memory_budget_mib=host_memory_budget,
            headroom_mib=headroom,
            lock_timeout_s=move_timeout,
            callback_timeout_s=move_timeout,
            driver_call_timeout_s=driver_call_timeout,
            slowest_copy_gbps=slowest_copy_gbps,
        ),
    )
    try:
        asyncio.run(run_agent(config))
    except BackendUnavailable as exc:
        typer.echo(f"baton agent: --backend {backend}: {exc}", err=True)
        raise typer.Exit(2) from None
    except (StateDirError, KubeConfigError, AgentStartError, RuntimeError) as exc:
        typer.echo(f"baton agent: {exc}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        pass


def bench_handoff(
    iterations: Annotated[int, typer.Option(help="Samples per measurement.")] = 500,
    client: Annotated[
        str, typer.Option(help="Tenants use the blocking `Baton` or the asyncio `AsyncBaton`.")
    ] = "blocking",
    transport: Annotated[
        str,
        typer.Option(
            help="The session travels as frames on the handshake socket (direct) or over gRPC."
        ),
    ] = "direct",
    api: Annotated[
        str, typer.Option(help="Through Baton's own API, or llm-d's time-slicing API (llmd).")
    ] = "baton",
    backend: Annotated[
        str,
        typer.Option(help=f"The agent's parking backend: {described(PLAIN)} ({CUDA} on a GPU)."),
    ] = NONE,
    hold_ms: Annotated[float, typer.Option(help="How long each tenant holds its turn.")] = 2.0,
    tenants: Annotated[int, typer.Option(help="Tenant processes taking turns.")] = 2,
    swap: Annotated[
        bool,
        typer.Option(
            help="Tenants' memory does not fit together: each handoff parks one, restores one."
        ),
    ] = False,
    rounds: Annotated[
        int, typer.Option(help="Rounds in which the rows take turns (each ≥ 50 iterations).")
    ] = 3,
    as_json: AsJson = False,
) -> None:
    """Uncontended acquire and yield→grant handoff between tenant processes, with the bare
    relay (and, with a parking backend, the agent without one) measured in the same run."""
    from baton.bench.handoff import run_handoff_bench

    if api not in ("baton", "llmd"):
        raise typer.BadParameter(f"unknown API {api!r}; choose baton or llmd", param_hint="--api")
    if api == "llmd":
        from baton.bench.llmd_handoff import run_llmd_handoff_bench

        echo_figures(run_llmd_handoff_bench(iterations), as_json)
        return
    try:
        figures = run_handoff_bench(
            iterations,
            client,
            transport,
            backend=backend,
            hold_ms=hold_ms,
            tenants=tenants,
            swap=swap,
            rounds=rounds,
        )
    except ValueError as e:
        words = ("transport", "backend", "tenants", "hold-ms", "swap", "client")
        hint = next(f"--{w}" for w in words if w in str(e) or w == "client")
        raise typer.BadParameter(str(e), param_hint=hint) from None
    echo_figures(figures, as_json)


def bench_evacuate(
    backend: Annotated[str, typer.Option(help="fake or cuda.")] = "fake",
    size_mib: Annotated[int, typer.Option(help="Bytes to park and restore, MiB.")] = 512,
    runs: Annotated[int, typer.Option(help="Park/restore rounds; the fastest counts.")] = 3,
    as_json: AsJson = False,
) -> None:
    """Park and restore throughput against a plain memory copy of the same size."""
    from agent.parking.backends.base import BackendUnavailable
    from baton.bench.evacuate import run

    try:
        result = run(backend, size_mib, runs)
    except (BackendUnavailable, ValueError) as exc:
        typer.echo(f"baton bench evacuate: {exc}", err=True)
        raise typer.Exit(2) from None
    echo_figures(result, as_json)


def bench_fairness(
    seconds: Annotated[float, typer.Option(help="GPU time replayed per policy, s.")] = 600.0,
    handoff_iterations: Annotated[
        int, typer.Option(help="Handoffs per policy for the cost on a real handoff; 0 = skip.")
    ] = 500,
    mix: Annotated[
        list[str] | None,
        typer.Option(
            "--mix",
            help="A tenant mix (skewed, long-turns, equal, trainer-batch, duty-above-half, "
            "tenfold, tenfold-gaps); repeat it; "
            "default: all, the first one's figures at the top level.",
        ),
    ] = None,
    process_seconds: Annotated[
        float,
        typer.Option(
            help="Seconds each mix also runs as tenant processes against a real agent, per "
            "policy; 0 = replay only.",
        ),
    ] = 10.0,
    as_json: AsJson = False,
) -> None:
    """Tenant mixes on one GPU: the fair policy against FIFO on each, same run."""
    from baton.bench.fairness import run_fairness_bench

    try:
        figures = run_fairness_bench(
            seconds, handoff_iterations, mixes=mix, process_seconds=process_seconds
        )
    except ValueError as exc:
        typer.echo(f"baton bench fairness: {exc}", err=True)
        raise typer.Exit(2) from None
    echo_figures(figures, as_json)


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add this component's commands to `baton` and its benchmarks to `baton bench`."""
    app.command("agent")(agent)
    bench.command("handoff")(bench_handoff)
    bench.command("evacuate")(bench_evacuate)
    bench.command("fairness")(bench_fairness)

"""`baton agent` and the agent's benchmarks (registered by `commands.cli`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, get_type_hints

import typer

from agent.core.policy import DEFAULT_QUEUE_POLICY
from agent.parking.methods import CUDA, NONE, PLAIN, described
from baton.contract import names
from commands.cli.agent_settings import AgentSettings, command_options, env_of
from commands.cli.options import (
    AsJson,
    check_address,
    check_dir,
    check_grace,
    check_node_name,
    echo_figures,
    interruptible,
    setup_logging,
)

if TYPE_CHECKING:
    from agent.assembly import AgentConfig
    from baton.contract.shutdown import StopSignal


ABOVE_ZERO = ("max_hold", "move_timeout", "driver_call_timeout", "slowest_copy_gbps", "fake_scale")
"""The settings that mean nothing at zero or below (seconds, rates, a scale; each in FINITE)."""
FINITE = tuple(name for name, kind in get_type_hints(AgentSettings).items() if kind is float)
"""Every number of seconds, rate or scale: none means anything at infinity (a timeout that
never passes hangs; "never" has a spelling of its own where it is a choice, e.g. -1 or 0)."""
FAIR_FLAGS = {
    "min_share": "--fair-min-share", "credit_s": "--fair-credit",
    "tier_grace_s": "--tier-grace", "anticipate_s": "--fair-anticipate",
}  # fmt: skip
"""The fair policy's settings (`FairConfig`'s fields) and the flags that set them."""
ADDRESSES = ("llmd_listen", "coordination_listen", "coordination_advertise", "coordinator")
"""The settings that are HOST:PORT (or empty: off)."""


def _queue_policy(queue_policy: str | None, deprecated: str | None) -> str:
    """`--queue-policy`, else the deprecated `--policy` (saying so once on stderr), else fair."""
    if deprecated is not None:
        typer.echo(
            f"baton agent: --policy ({env_of('policy')}) is deprecated; "
            f"use --queue-policy ({env_of('queue_policy')})",
            err=True,
        )
    return queue_policy or deprecated or DEFAULT_QUEUE_POLICY


@command_options(AgentSettings)
def agent(**options: Any) -> None:
    """Run the node agent: turn-taking leases on this node's GPUs."""
    from baton.contract.shutdown import StopSignal

    with StopSignal().caught() as early:  # from here on a stop signal is noted till it runs
        _run_agent(options, early)


def _run_agent(options: dict[str, Any], early: StopSignal) -> None:
    import asyncio

    from agent.assembly import AgentStartError, run_agent
    from agent.node.state import StateDirError
    from agent.parking.backends.base import BackendUnavailable
    from baton.contract.kube import KubeConfigError

    settings = AgentSettings(**options)
    setup_logging(settings.log_level)
    config = _agent_config(settings)
    try:
        asyncio.run(run_agent(config, early))
    except BackendUnavailable as exc:
        typer.echo(f"baton agent: --backend {settings.backend}: {exc}", err=True)
        raise typer.Exit(2) from None
    except (StateDirError, KubeConfigError, AgentStartError, RuntimeError) as exc:
        typer.echo(f"baton agent: {exc}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        pass


def _agent_config(s: AgentSettings) -> AgentConfig:
    """The agent's config from its settings; a setting it cannot use is a `BadParameter`."""
    from agent.assembly import AgentConfig
    from agent.core.fair import BadFairConfig, FairConfig
    from agent.core.policy import QUEUE_POLICIES
    from agent.parking.setup import ParkingOptions
    from agent.server.llmd.groups import Groups, GroupSpecError

    for name in FINITE:
        value, flag = getattr(s, name), f"--{name.replace('_', '-')}"
        if name in ABOVE_ZERO and not value > 0:  # (NaN too)
            raise typer.BadParameter(f"{value}: must be above 0", param_hint=flag)
        if not math.isfinite(value):
            raise typer.BadParameter(f"{value}: must be a finite number", param_hint=flag)
    for name in ADDRESSES:
        check_address(getattr(s, name), f"--{name.replace('_', '-')}", name == "llmd_listen")
    if not Path(s.socket).name:  # "", "/", ".": no name to bind, nor one beside it
        raise typer.BadParameter(
            f"{s.socket!r} names no socket file: pass its path, e.g. {names.AGENT_SOCKET}",
            param_hint="--socket",
        )
    check_dir(s.state_dir, "--state-dir", names.AGENT_STATE_DIR)
    check_dir(s.fake_dir, "--fake-dir", names.DEFAULT_FAKE_GPU_DIR)
    check_grace(s.shutdown_grace)
    if s.node_name:  # else it watches the pods of a node that cannot be, and serves none
        try:
            check_node_name(s.node_name)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
    order = _queue_policy(s.queue_policy, s.policy)
    if order not in QUEUE_POLICIES:
        choices = ", ".join(QUEUE_POLICIES)
        raise typer.BadParameter(f"unknown policy {order!r}; choose one of {choices}")
    try:
        grace = s.tier_grace if s.tier_grace >= 0 else None
        fair = FairConfig(s.fair_min_share, s.fair_credit, grace, anticipate_s=s.fair_anticipate)
    except BadFairConfig as exc:
        raise typer.BadParameter(exc.why, param_hint=FAIR_FLAGS[exc.field]) from None
    try:
        Groups.from_specs(s.llmd_group or ())
    except GroupSpecError as exc:
        raise typer.BadParameter(str(exc), param_hint="--llmd-group") from None
    return AgentConfig(
        coordination_listen=s.coordination_listen,
        coordination_token=_coordination_token(s.coordination_listen, s.coordination_token_file),
        coordination_advertise=s.coordination_advertise,
        coordinator=s.coordinator,
        socket=s.socket,
        state_dir=s.state_dir,
        http_host=s.http_host,
        http_port=s.http_port,
        debug_tcp_port=s.debug_tcp_port,
        queue_policy=order,
        fair=fair,
        max_hold=s.max_hold,
        reconnect_grace=s.reconnect_grace,
        forget_departed_after=s.forget_departed_after,
        socket_mode=_socket_mode(s.socket_mode),
        node_name=s.node_name,
        allow_local_tenants=s.allow_local_tenants,
        kubeconfig=s.kubeconfig,
        proc_root=s.proc_root,
        shutdown_grace=s.shutdown_grace,
        llmd_listen=s.llmd_listen,
        llmd_groups=tuple(s.llmd_group or ()),
        llmd_forget_idle_after=s.llmd_forget_idle_after,
        parking=ParkingOptions(
            backend=s.backend,
            fake_gpus=s.fake_gpus,
            node_name=s.node_name,
            fake_scale=s.fake_scale,
            fake_dir=s.fake_dir,
            pcie_gbps=s.pcie_gbps,
            host_memory_budget_mib=_host_memory_budget(s.host_memory_budget),
            headroom_mib=s.headroom,
            lock_timeout_s=s.move_timeout,
            callback_timeout_s=s.move_timeout,
            driver_call_timeout_s=s.driver_call_timeout,
            slowest_copy_gbps=s.slowest_copy_gbps,
        ),
    )


def _host_memory_budget(spec: str) -> int:
    """`--host-memory-budget` in MiB (0: auto), from MiB or a share of MemTotal (`50%`), as the
    device plugin and the DRA driver read the same variable (BATON_HOST_MEMORY_BUDGET)."""
    from baton.contract.meminfo import MEMINFO
    from nodegpu.annotate import host_memory_budget_mib

    try:
        meminfo = Path(MEMINFO).read_text() if spec.strip().endswith("%") else ""
        return host_memory_budget_mib(spec, meminfo)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _socket_mode(mode: str) -> int:
    """`--socket-mode` as a number: octal permission bits, e.g. 0660."""
    try:
        bits = int(mode, 8)
    except ValueError:
        bits = -1
    if not 0 <= bits <= 0o777:
        raise typer.BadParameter(
            f"{mode!r} is no octal file mode (e.g. 0660)", param_hint="--socket-mode"
        )
    return bits


def _coordination_token(listen: str, path: str) -> str:
    """The coordination token from its file; required (and only read) with a listen address."""
    if not listen:
        return ""
    if not path:
        raise typer.BadParameter(
            "--coordination-listen needs the coordinator's token: pass --coordination-token-file",
            param_hint="--coordination-token-file",
        )
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise typer.BadParameter(
            f"cannot read {path} ({exc.strerror})", param_hint="--coordination-token-file"
        ) from None
    if not token:
        raise typer.BadParameter(f"{path} is empty", param_hint="--coordination-token-file")
    return token


def bench_handoff(
    iterations: Annotated[int, typer.Option(min=1, help="Samples per measurement.")] = 500,
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
    hold_ms: Annotated[
        float, typer.Option(help="How long each tenant holds its turn, in ms: at most 500.")
    ] = 2.0,
    tenants: Annotated[
        int,
        typer.Option(
            help="Tenant processes taking turns, 2 to 64: each is a process of its own, and past "
            "a few dozen the handoff measured is the machine's process scheduler's more than the "
            "agent's."
        ),
    ] = 2,
    swap: Annotated[
        bool,
        typer.Option(
            help="Tenants' memory does not fit together: each handoff parks one, restores one."
        ),
    ] = False,
    rounds: Annotated[
        int,
        typer.Option(min=1, help="Rounds in which the rows take turns (each ≥ 50 iterations)."),
    ] = 3,
    as_json: AsJson = False,
) -> None:
    """Uncontended acquire and yield→grant handoff between tenant processes, with the bare
    relay (and, with a parking backend, the agent without one) measured in the same run."""
    from commands.bench.handoff import run_handoff_bench

    if api not in ("baton", "llmd"):
        raise typer.BadParameter(f"unknown API {api!r}; choose baton or llmd", param_hint="--api")
    if api == "llmd":
        from commands.bench.llmd_handoff import run_llmd_handoff_bench

        baton_only = {
            "--client": client != "blocking", "--transport": transport != "direct",
            "--backend": backend != NONE, "--hold-ms": hold_ms != 2.0, "--tenants": tenants != 2,
            "--swap": swap, "--rounds": rounds != 3,
        }  # fmt: skip
        if wrong := next((flag for flag, given in baton_only.items() if given), None):
            raise typer.BadParameter("applies to --api baton only, not llmd", param_hint=wrong)
    try:
        if api == "llmd":
            figures = run_llmd_handoff_bench(iterations)
        else:
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
    except RuntimeError as e:  # a tenant that failed, or a run too short to see a handoff
        typer.echo(f"baton bench handoff: {e}", err=True)
        raise typer.Exit(1) from None
    echo_figures(figures, as_json)


def bench_evacuate(
    backend: Annotated[str, typer.Option(help="fake or cuda.")] = "fake",
    size_mib: Annotated[int, typer.Option(help="Bytes to park and restore, MiB.")] = 512,
    runs: Annotated[int, typer.Option(help="Park/restore rounds; the fastest counts.")] = 3,
    as_json: AsJson = False,
) -> None:
    """Park and restore throughput against a plain memory copy of the same size."""
    from agent.parking.backends.base import BackendUnavailable
    from commands.bench.evacuate import run

    try:
        result = run(backend, size_mib, runs)
    except (BackendUnavailable, ValueError) as exc:
        typer.echo(f"baton bench evacuate: {exc}", err=True)
        raise typer.Exit(2) from None
    except RuntimeError as exc:  # the CUDA child process that could not allocate
        typer.echo(f"baton bench evacuate: {exc}", err=True)
        raise typer.Exit(1) from None
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
            "policy, split into --process-rounds runs; 0 = replay only.",
        ),
    ] = 30.0,
    process_rounds: Annotated[
        int,
        typer.Option(
            help="Runs of each policy the process-level seconds are split into, the policies "
            "taking turns (so a drift of the machine's speed weighs on both alike).",
        ),
    ] = 3,
    as_json: AsJson = False,
) -> None:
    """Tenant mixes on one GPU: the fair policy against FIFO on each, same run."""
    from commands.bench.fairness import run_fairness_bench

    try:
        figures = run_fairness_bench(
            seconds,
            handoff_iterations,
            mixes=mix,
            process_seconds=process_seconds,
            process_rounds=process_rounds,
        )
    except ValueError as exc:
        typer.echo(f"baton bench fairness: {exc}", err=True)
        raise typer.Exit(2) from None
    except RuntimeError as exc:  # a tenant process that failed
        typer.echo(f"baton bench fairness: {exc}", err=True)
        raise typer.Exit(1) from None
    echo_figures(figures, as_json)


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add this component's commands to `baton` and its benchmarks to `baton bench`."""
    app.command("agent")(agent)
    bench.command("handoff")(interruptible("baton bench handoff", bench_handoff))
    bench.command("evacuate")(interruptible("baton bench evacuate", bench_evacuate))
    bench.command("fairness")(interruptible("baton bench fairness", bench_fairness))

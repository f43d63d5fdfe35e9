"""`baton agent`'s options, described once: each `AgentSettings` field is one flag
(`--field-name`) with its type, default, environment variable and help; `command_options` turns
them into the command's parameters, and the command reads them once, into one `AgentSettings`."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar, get_args, get_type_hints

import typer

from agent.core.policy import DEFAULT_QUEUE_POLICY
from agent.parking.methods import CHOICES, NONE, described
from baton.contract import names
from baton.contract.shutdown import DEFAULT_GRACE_S
from commands.cli.options import PORT_MAX, Kubeconfig, LogLevel

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Flag:
    """How one setting is given: its environment variable, help, whether `--help` lists it, and
    the lowest and highest values it takes (None: no bound)."""

    env: str
    help: str | None = None
    hidden: bool = False
    min: float | None = None
    max: float | None = None


def setting(
    default: Any,
    env: str,
    help: str | None = None,
    *,
    hidden: bool = False,
    min: float | None = None,
    max: float | None = None,
) -> Any:
    """A settings field: its default and how it is given (`Flag`)."""
    return field(default=default, metadata={"flag": Flag(env, help, hidden, min, max)})


def shared(option: Any, default: Any) -> Any:
    """An option the daemons share (`commands.cli.options`): its env var and help from there."""
    info = get_args(option)[1]
    return setting(default, info.envvar, info.help)


@dataclass(frozen=True)
class AgentSettings:
    """What `baton agent` was given, from its command line or environment."""

    # Where it serves.
    socket: str = setting(names.AGENT_SOCKET, names.ENV_AGENT_SOCKET, "gRPC unix socket.")
    state_dir: str = setting(
        names.AGENT_STATE_DIR, "BATON_AGENT_STATE_DIR", "Durable state directory."
    )
    http_host: str = setting("0.0.0.0", "BATON_AGENT_HTTP_HOST", "Status/metrics address.")
    http_port: int = setting(
        names.PORT_AGENT, "BATON_AGENT_HTTP_PORT", "Status/metrics; 0 = any.", min=0, max=PORT_MAX
    )
    debug_tcp_port: int = setting(
        0, "BATON_AGENT_DEBUG_TCP_PORT", "Also on 127.0.0.1; 0 = off.", min=0, max=PORT_MAX
    )

    # Who takes the next turn, and for how long.
    queue_policy: str | None = setting(
        None,
        "BATON_AGENT_QUEUE_POLICY",
        "Who is served next: fifo, lrs (least recently served) or fair (weighted fair "
        f"turns in priority tiers). Default {DEFAULT_QUEUE_POLICY}.",
    )
    fair_min_share: float = setting(
        0.1,
        "BATON_AGENT_FAIR_MIN_SHARE",
        "fair: share of a GPU a lower tier keeps while a higher one waits (0-0.5).",
    )
    fair_credit: float = setting(
        10.0, "BATON_AGENT_FAIR_CREDIT", "fair: GPU-seconds an idle tenant may bank."
    )
    fair_anticipate: float = setting(
        0.01,
        "BATON_AGENT_FAIR_ANTICIPATE",
        "fair: seconds a GPU is kept for an owed tenant that yielded and usually asks "
        "again within them (idle GPU time, charged to it, against the share of tenants with "
        "short turns and gaps); 0 = off.",
    )
    tier_grace: float = setting(
        -1.0,
        "BATON_AGENT_TIER_GRACE",
        "fair: seconds before a higher tier's waiter revokes a lower tier's holder "
        "(negative = never; it waits for the holder's yield).",
    )
    policy: str | None = setting(
        None, "BATON_AGENT_POLICY", "Deprecated alias of --queue-policy.", hidden=True
    )
    max_hold: float = setting(60.0, "BATON_AGENT_MAX_HOLD", "Seconds before revocation.")
    reconnect_grace: float = setting(10.0, "BATON_AGENT_RECONNECT_GRACE", "After a restart.", min=0)
    forget_departed_after: float = setting(
        3600.0,
        "BATON_AGENT_FORGET_DEPARTED_AFTER",
        "Seconds after a tenant leaves the node before its accounting is folded into "
        "<namespace>/(departed) (off /metrics, kept in /v1/status); 0 = never.",
        min=0,
    )
    socket_mode: str = setting("0660", "BATON_AGENT_SOCKET_MODE", "Octal mode of the sockets.")

    # Parking.
    backend: str = setting(
        NONE,
        names.ENV_AGENT_BACKEND,
        f"Parking: {described(CHOICES)}, or several (cuda,app: first = default).",
    )
    fake_gpus: str = setting(
        "2x81920", names.ENV_FAKE_GPUS, "Simulated GPUs: COUNTxMiB or MiB,MiB,..."
    )
    fake_scale: float = setting(1 / 1024, names.ENV_FAKE_SCALE, "Real bytes per simulated byte.")
    fake_dir: str = setting(
        names.DEFAULT_FAKE_GPU_DIR, names.ENV_FAKE_GPU_DIR, "Simulated device memory files."
    )
    pcie_gbps: float = setting(
        0.0, names.ENV_PCIE_GBPS, "Modelled GB/s of a fake move; 0 = off.", min=0
    )
    host_memory_budget: str = setting(
        "0",
        names.ENV_HOST_MEMORY_BUDGET,
        "MiB for parked memory, or % of MemTotal (as the device plugin's); 0 = auto.",
    )
    headroom: int | None = setting(
        None,
        names.ENV_HEADROOM,
        "MiB kept free on each GPU (and needed free beyond a restore's bytes); "
        "default: the most its methods want (cuda 1024; app on real GPUs room for what its "
        "parked tenants leave there), else 0.",
        min=0,
    )
    move_timeout: float = setting(
        5.0, names.ENV_MOVE_TIMEOUT, "Seconds for a lock, or a callback beyond its bytes' copy."
    )
    driver_call_timeout: float = setting(
        10.0,
        names.ENV_DRIVER_CALL_TIMEOUT,
        "cuda: seconds a driver call may take beyond its lock timeout or copy time.",
    )
    slowest_copy_gbps: float = setting(
        1.0,
        names.ENV_SLOWEST_COPY_GBPS,
        "The slowest GB/s a park's or restore's deadline allows for (cuda, app, endpoint).",
    )

    # The node and its cluster.
    node_name: str = setting(
        "",
        names.ENV_NODE_NAME,
        "In Kubernetes: watch this node's pods; also names the fake GPUs.",
    )
    allow_local_tenants: bool = setting(
        False,
        "BATON_AGENT_ALLOW_LOCAL_TENANTS",
        "With --node-name: let processes in no pod register as tenants too.",
    )
    kubeconfig: str | None = shared(Kubeconfig, None)
    proc_root: str = setting("/proc", "BATON_PROC_ROOT", "The host's /proc (PID → pod).")
    shutdown_grace: float = setting(
        DEFAULT_GRACE_S,
        "BATON_AGENT_SHUTDOWN_GRACE",
        "Seconds in-flight RPCs get on SIGTERM.",
        min=0,
    )

    # llm-d's time-slicing API.
    llmd_listen: str = setting(
        "",
        names.ENV_LLMD_LISTEN,
        "Also serve llm-d's time-slicing API here (HOST:PORT, plaintext); off if empty.",
    )
    llmd_group: list[str] | None = setting(  # noqa: RUF009 (`setting` is a `field`)
        None,
        names.ENV_LLMD_GROUPS,
        "An llm-d group outside Kubernetes: NAME=GPU[,GPU...] (repeatable).",
    )
    llmd_forget_idle_after: float = setting(
        3600.0,
        "BATON_AGENT_LLMD_FORGET_IDLE_AFTER",
        "Seconds no llm-d call names a job used only by callers whose process the agent cannot "
        "find (another host), with no turn, wait or parked memory, before it leaves; 0 = never.",
        min=0,
    )

    # The cluster coordinator's job turns.
    coordination_listen: str = setting(
        "",
        "BATON_AGENT_COORDINATION_LISTEN",
        "Serve the coordinator's job turns here (HOST:PORT); off if empty.",
    )
    coordination_token_file: str = setting(
        "",
        "BATON_COORDINATION_TOKEN_FILE",
        "A file holding the token the coordinator's calls carry (from a Secret).",
    )
    coordinator: str = setting(
        "",
        "BATON_COORDINATOR",
        "HOST:PORT of the coordinator: job members' own acquires take their job's turn there.",
    )
    coordination_advertise: str = setting(
        "",
        "BATON_AGENT_COORDINATION_ADVERTISE",
        "HOST:PORT the coordinator dials (default: the listen address), put on the node.",
    )

    log_level: str = shared(LogLevel, "INFO")


def flag_of(setting_field: dataclasses.Field[Any]) -> Flag:
    """How a settings field is given."""
    flag = setting_field.metadata["flag"]
    assert isinstance(flag, Flag)
    return flag


def env_of(name: str) -> str:
    """The environment variable of the `AgentSettings` field `name`."""
    (found,) = [f for f in dataclasses.fields(AgentSettings) if f.name == name]
    return flag_of(found).env


def command_options(settings: type[Any]) -> Callable[[F], F]:
    """Give a command (taking `**options`) one option per field of `settings`, in their order."""
    hints = get_type_hints(settings)
    parameters = []
    for each in dataclasses.fields(settings):
        flag = flag_of(each)
        option = typer.Option(
            envvar=flag.env, help=flag.help, hidden=flag.hidden, min=flag.min, max=flag.max
        )
        parameters.append(
            inspect.Parameter(
                each.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=each.default,
                annotation=Annotated[hints[each.name], option],
            )
        )

    def decorate(command: F) -> F:
        command.__signature__ = inspect.Signature(parameters, return_annotation=None)  # type: ignore[attr-defined]
        return command

    return decorate

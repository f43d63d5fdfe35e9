"""Options and output that the components' `baton` commands share."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any, ParamSpec

import typer

from baton.contract import names
from nodegpu.annotate import DEFAULT_HOST_MEMORY_BUDGET
from nodegpu.health import DEFAULT_IGNORED_XIDS

if TYPE_CHECKING:
    from nodegpu.inventory import NodeGpu
    from nodegpu.node import NodeSettings

Kubeconfig = Annotated[
    str | None,
    typer.Option(envvar=names.ENV_KUBECONFIG, help="Kubeconfig file; default: in-cluster."),
]
LogLevel = Annotated[
    str, typer.Option(envvar=names.ENV_LOG_LEVEL, help="DEBUG, INFO, WARNING or ERROR.")
]
AsJson = Annotated[bool, typer.Option("--json", help="One JSON object on the last line.")]

# The node daemons' (`baton deviceplugin`, `baton dra`) options about the node and its GPUs.
NodeName = Annotated[
    str, typer.Option(envvar=names.ENV_NODE_NAME, help="This node's name (downward API).")
]
MAX_SLOTS_PER_GPU = 1024
"""Slots per GPU at most: a node's device list (8 GPUs of 1,024 IDs each) stays far below the
kubelet's 4 MiB gRPC message, which about 8,900 slots per GPU would pass."""
SlotsPerGpu = Annotated[
    int,
    typer.Option(
        envvar="BATON_SLOTS_PER_GPU",
        min=1,
        max=MAX_SLOTS_PER_GPU,
        help=f"Tenants (slots) per GPU (1 to {MAX_SLOTS_PER_GPU}).",
    ),
]
FakeGpus = Annotated[
    str | None,
    typer.Option(
        envvar=names.ENV_FAKE_GPUS,
        help="Simulated GPUs: COUNTxMiB (2x81920), MiB,MiB,... or a JSON/YAML file.",
    ),
]
HostMemoryBudget = Annotated[
    str,
    typer.Option(
        envvar=names.ENV_HOST_MEMORY_BUDGET, help="Parked-memory budget: MiB or % of MemTotal."
    ),
]
IgnoredXids = Annotated[
    str, typer.Option(envvar="BATON_IGNORED_XIDS", help="XIDs that do not fail a GPU.")
]
IGNORED_XIDS_DEFAULT = ",".join(map(str, DEFAULT_IGNORED_XIDS))
HOST_MEMORY_BUDGET_DEFAULT = DEFAULT_HOST_MEMORY_BUDGET

P = ParamSpec("P")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
PORT_MAX = 65535
"""The highest TCP port a port option takes (its lowest is 0: any free port)."""


def check_address(value: str, option: str, grpc: bool = False) -> None:
    """A HOST:PORT option's value (empty: off), or a `BadParameter` naming the option; one a
    `grpc` server listens on names its host (gRPC binds no address for an empty one)."""
    host, colon, port = value.rpartition(":")
    if value and not (colon and port.isdigit() and int(port) <= PORT_MAX):
        raise typer.BadParameter(
            f"{value!r} is not HOST:PORT (port 0-{PORT_MAX})", param_hint=option
        )
    if value and grpc and not host:
        raise typer.BadParameter(
            f"{value!r} names no host: pass 0.0.0.0:{port}, or [::]:{port}, to listen on every "
            "interface",
            param_hint=option,
        )


def check_dir(value: str, option: str, example: str) -> None:
    """A directory option's value, or a `BadParameter` naming the option: an empty path is
    the current directory, where the daemon would keep its files unasked."""
    if not value:
        raise typer.BadParameter(
            f"'' names no directory: pass its path, e.g. {example}", param_hint=option
        )
    if Path(value).exists() and not Path(value).is_dir():
        raise typer.BadParameter(f"{value} is not a directory", param_hint=option)


def check_grace(value: float, option: str = "--shutdown-grace") -> None:
    """A daemon's shutdown grace (seconds in-flight calls get on a stop), or a `BadParameter`
    naming the option: a negative, NaN or infinite grace has no stop to wait for."""
    if not (math.isfinite(value) and value >= 0):
        raise typer.BadParameter(
            f"{value}: must be a finite number of seconds, 0 or more", param_hint=option
        )


def setup_logging(level: str) -> None:
    """Log to stderr at `level` (DEBUG, INFO, ...) in the daemons' one format."""
    if level.upper() not in logging.getLevelNamesMapping():
        raise typer.BadParameter(
            f"{level!r}; choose one of DEBUG, INFO, WARNING, ERROR",
            param_hint=f"--log-level ({names.ENV_LOG_LEVEL})",
        )
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)
    # The Kubernetes client's connection pool warns on every retry of every request; the
    # daemons say once what is unreachable and what they do about it (`baton.contract.kube.Outage`).
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)


@dataclass(frozen=True)
class NodeOptions:
    """The node options every node daemon takes, as given on its command line."""

    node_name: str
    kubeconfig: str | None
    slots_per_gpu: int
    fake_gpus: str | None
    host_memory_budget: str
    ignored_xids: str
    metrics_host: str
    metrics_port: int
    shutdown_grace: float


@dataclass(frozen=True)
class NodeInputs:
    """What a node daemon reads before it starts: its node settings, GPUs and API client."""

    settings: NodeSettings
    gpus: list[NodeGpu]
    fake: bool
    api_client: Any


def node_options(arguments: Mapping[str, Any]) -> NodeOptions:
    """The node options among a node command's arguments (its parameters bear their names)."""
    return NodeOptions(**{f.name: arguments[f.name] for f in dataclasses.fields(NodeOptions)})


def check_name(value: str, option: str, what: str, label: bool = False) -> None:
    """An option naming a Kubernetes object (`label`: one named by a DNS label, a namespace), or
    a `BadParameter` naming the option: the API server would refuse every call about it, again
    and again."""
    problem = names.name_problem(what, value, dotted=not label)
    if problem:
        raise typer.BadParameter(problem, param_hint=option)


def check_node_name(name: str) -> None:
    """ValueError unless `name` can be a Kubernetes node's (a DNS subdomain): an empty one
    would watch every unscheduled pod (`spec.nodeName=`) and annotate no node."""
    if not name:
        raise ValueError(
            f"--node-name ({names.ENV_NODE_NAME}) is empty: give this node's name (in a pod, "
            "the downward API's spec.nodeName)"
        )
    problem = names.name_problem("node", name, dotted=True)
    if problem:
        raise ValueError(f"--node-name: {problem}")


def node_inputs(command: str, options: NodeOptions) -> NodeInputs:
    """Read the node name, budget, XIDs and fake GPUs' spec, then discover the GPUs (or make the
    fake ones) and read the kubeconfig; a problem ends the command with one line naming it: exit
    status 2 for a value that cannot be right (as a `BadParameter`), 1 for what the node lacks."""
    from baton.contract.kube import KubeConfigError, load_api_client
    from baton.contract.meminfo import MEMINFO
    from nodegpu.annotate import host_memory_budget_mib
    from nodegpu.gpus import BadFakeGpus, DiscoveryError, discover
    from nodegpu.health import parse_xid_list
    from nodegpu.node import NodeSettings

    try:
        check_node_name(options.node_name)
        budget = host_memory_budget_mib(options.host_memory_budget, Path(MEMINFO).read_text())
        ignored_xids = parse_xid_list(options.ignored_xids)
        gpus, fake = discover(options.fake_gpus, options.node_name)
        api_client = load_api_client(options.kubeconfig)
    except (BadFakeGpus, ValueError) as err:  # the value given: a usage mistake
        typer.echo(f"{command}: {err}", err=True)
        raise typer.Exit(2) from err
    except (DiscoveryError, KubeConfigError) as err:  # no GPU, no usable kubeconfig
        typer.echo(f"{command}: {err}", err=True)
        raise typer.Exit(1) from err
    settings = NodeSettings(
        node_name=options.node_name,
        slots_per_gpu=options.slots_per_gpu,
        host_memory_budget_mib=budget,
        metrics_host=options.metrics_host,
        metrics_port=options.metrics_port,
        ignored_xids=ignored_xids,
        shutdown_grace=options.shutdown_grace,
    )
    return NodeInputs(settings, list(gpus), fake, api_client)


def echo_figures(figures: Mapping[str, object], as_json: bool) -> None:
    """A bench's result: one JSON object on the last line, after a table unless `as_json`."""
    if not as_json:
        width = max(map(len, figures), default=0)
        for key, value in figures.items():
            typer.echo(f"{key:>{width}}: {value}")
    typer.echo(json.dumps(figures))


def interruptible(command: str, run: Callable[P, None]) -> Callable[P, None]:
    """`run` (a bench's or the demo's command) stopped by Ctrl-C (SIGINT) or SIGTERM as one: it
    unwinds, stopping what it started and removing its files on the way out, then says it was
    interrupted in one line (exit status 130). A file it cannot make or write (a /tmp it cannot
    write to) ends it in one line naming the file and why (exit status 1)."""

    @functools.wraps(run)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> None:
        terminated = []

        def as_ctrl_c(signum: int, frame: FrameType | None) -> None:
            terminated.append(signum)
            signal.raise_signal(signal.SIGINT)  # its handler (asyncio's cancels the main task)

        main = threading.current_thread() is threading.main_thread()  # signals go to it only
        previous = signal.signal(signal.SIGTERM, as_ctrl_c) if main else None
        # Started with SIGINT ignored (in the background of a script): Python's own handler for
        # the run, which asyncio replaces with one that cancels the main task, so that SIGTERM
        # unwinds it as Ctrl-C does (a KeyboardInterrupt raised inside the event loop instead
        # cancels every task at once, and the agents' stops and the cleanups break off).
        ignored = main and not callable(signal.getsignal(signal.SIGINT))
        sigint = signal.signal(signal.SIGINT, signal.default_int_handler) if ignored else None
        try:
            run(*args, **kwargs)
        except KeyboardInterrupt:
            how = "SIGTERM" if terminated else "Ctrl-C (SIGINT)"
            typer.echo(f"{command}: interrupted by {how}", err=True)
            raise typer.Exit(130) from None
        except OSError as err:
            if err.filename is None:
                raise
            top = next((d for d in TEMP_DIRS if str(err.filename).startswith(f"{d}/")), "")
            why = f"; it keeps its sockets and work files under {top}" if top else ""
            typer.echo(f"{command}: {err.filename}: {err.strerror}{why}", err=True)
            raise typer.Exit(1) from None
        finally:
            if main:
                signal.signal(signal.SIGTERM, previous)
            if ignored:
                signal.signal(signal.SIGINT, sigint)

    return guarded


TEMP_DIRS = ("/tmp", "/dev/shm")
"""Where the benches and the demo make their work directories (short paths, for the sockets)."""

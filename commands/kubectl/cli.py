"""`kubectl-baton`, the kubectl plugin: `kubectl baton status|jobs|why|usage`."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from baton.contract.names import NAMESPACE, name_problem
from commands.kubectl.api import Api, KubeApi, PluginError

app = typer.Typer(
    name="kubectl baton",
    help=(
        "Baton's GPUs through the API server: who holds them, why a pod waits, who used them, "
        "which job's turn spans which nodes."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
Output = Annotated[str, typer.Option("--output", "-o", help="table or json.")]


class Settings:
    """The connection options (and `-n`), before the command or after it, as kubectl takes
    them anywhere."""

    kubeconfig: str | None = None
    context: str | None = None
    baton_namespace: str = NAMESPACE
    namespace: str | None = None
    make_api: Callable[[str | None, str | None], Api] = KubeApi


NOT_SYNCED = (
    "the extender has not synced with the API server yet: GPUs' health and nodes' problems may "
    "be missing"
)

NO_AGENT_EXIT = 3
"""The exit status of `status` and `usage` when the Baton namespace runs no agent pod, and of
`jobs` when it runs no coordinator pod (1: no usable kubeconfig, or the API server unread or
refusing; 2: a bad option)."""

_KUBECONFIG_HELP = "The kubeconfig file to use (KUBECONFIG: files merged)."
Kubeconfig = Annotated[str | None, typer.Option("--kubeconfig", help=_KUBECONFIG_HELP)]
Context = Annotated[str | None, typer.Option("--context", help="The kubeconfig context to use.")]
BatonNamespace = Annotated[
    str | None,
    typer.Option("--baton-namespace", help=f"The namespace Baton is installed in ({NAMESPACE})."),
]


@app.callback()
def connection(
    kubeconfig: Annotated[
        str | None, typer.Option("--kubeconfig", envvar="KUBECONFIG", help=_KUBECONFIG_HELP)
    ] = None,
    context: Context = None,
    baton_namespace: BatonNamespace = None,
    namespace: Annotated[
        str | None,
        typer.Option(
            "--namespace", "-n", help="For why, usage and jobs, as their own -n (status reads all)."
        ),
    ] = None,
) -> None:
    """Connection options, as kubectl's: here or after the command."""
    Settings.kubeconfig, Settings.context = None, None
    Settings.baton_namespace, Settings.namespace = NAMESPACE, namespace
    _connection(kubeconfig, context, baton_namespace)


def _connection(kubeconfig: str | None, context: str | None, baton_namespace: str | None) -> None:
    """The connection options given (None: not given); given after the command, they win over
    the same given before it."""
    if kubeconfig:
        Settings.kubeconfig = kubeconfig
    if context is not None:
        Settings.context = context
    if baton_namespace is not None:
        _check_name("--baton-namespace", baton_namespace)
        Settings.baton_namespace = baton_namespace


@contextmanager
def connected() -> Iterator[Api]:
    """The API client; any PluginError becomes one line on stderr and exit status 1."""
    try:
        api = Settings.make_api(Settings.kubeconfig, Settings.context)
        try:
            yield api
        finally:
            getattr(api, "close", lambda: None)()
    except PluginError as err:
        typer.echo(f"kubectl baton: {err}", err=True)
        raise typer.Exit(1) from None


def _check_output(output: str) -> None:
    if output not in ("table", "json"):
        typer.echo(f"kubectl baton: --output is table or json, not {output!r}", err=True)
        raise typer.Exit(2)


def _check_name(what: str, name: str, dotted: bool = False) -> None:
    problem = name_problem(what, name, dotted)
    if problem:
        typer.echo(f"kubectl baton: {problem}", err=True)
        raise typer.Exit(2)


def _seconds(value: float) -> float:
    """A number of seconds the plugin can wait (inf or NaN cannot be)."""
    if not math.isfinite(value):
        raise typer.BadParameter(f"{value}: must be a finite number of seconds")
    return value


def _every(interval: float, count: int) -> Iterator[int]:
    """0, 1, 2, ... one per `interval` seconds; `count` of them (0 = until interrupted)."""
    pause = threading.Event()
    seen = 0
    while not count or seen < count:
        yield seen
        seen += 1
        if not count or seen < count:
            pause.wait(interval)


Watch = Annotated[bool, typer.Option("--watch", "-w", help="Refresh until Ctrl-C.")]
Interval = Annotated[
    float, typer.Option(help="Seconds between refreshes.", min=0.1, callback=_seconds)
]
Count = Annotated[int, typer.Option(help="With --watch: stop after this many.", min=0)]


@app.command()
def status(
    output: Output = "table",
    watch: Watch = False,
    interval: Interval = 2.0,
    count: Count = 0,
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    baton_namespace: BatonNamespace = None,
) -> None:
    """Every node's GPUs: holder, queue, resident and parked tenants, parked bytes against the
    budget, duty used against entitled."""
    from commands.kubectl.agents import read_cluster
    from commands.kubectl.status_view import status_table

    _connection(kubeconfig, context, baton_namespace)
    _check_output(output)
    console = Console()
    document: dict[str, Any] = {}
    with connected() as api:
        for _ in _every(interval, count if watch else 1):
            document = read_cluster(api, Settings.baton_namespace)
            if output == "json":
                typer.echo(json.dumps(document, indent=None if watch else 1))
            else:
                if watch:
                    console.clear()
                console.print(status_table(document))
                if document.get("synced") is False:  # its nodes, health and problems partial
                    console.print(f"[yellow]{NOT_SYNCED}[/yellow]")
                if document.get("extender_error"):
                    console.print(f"[yellow]{escape(document['extender_error'])}[/yellow]")
            if document.get("agents_error"):
                typer.echo(f"kubectl baton: {document['agents_error']}", err=True)
    if document.get("agents_error"):  # the last reading found none: a script must not read OK
        raise typer.Exit(NO_AGENT_EXIT)


@app.command()
def jobs(
    namespace: Annotated[
        str | None, typer.Option("--namespace", "-n", help="Only this namespace's jobs.")
    ] = None,
    output: Output = "table",
    watch: Watch = False,
    interval: Interval = 2.0,
    count: Count = 0,
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    baton_namespace: BatonNamespace = None,
) -> None:
    """Job turns across nodes (the cluster coordinator's): which job holds its GPUs on which
    nodes, which wait and for how long, the nodes its leader has not heard."""
    from commands.kubectl.jobs import (
        NoCoordinator,
        NoLeader,
        jobs_table,
        read_jobs,
        unsettled_lines,
    )

    _connection(kubeconfig, context, baton_namespace)
    namespace = Settings.namespace if namespace is None else namespace
    if namespace is not None:
        _check_name("namespace", namespace)
    _check_output(output)
    console = Console()
    leaderless: NoLeader | None = None
    with connected() as api:
        for _ in _every(interval, count if watch else 1):
            try:
                document = read_jobs(api, Settings.baton_namespace, namespace)
                leaderless = None
            except NoCoordinator as err:  # not installed: a script must not read OK
                typer.echo(f"kubectl baton: {err}", err=True)
                raise typer.Exit(NO_AGENT_EXIT) from None
            except NoLeader as err:  # an election: a watch reads again at the next refresh
                if not watch:
                    raise
                leaderless = err
                typer.echo(f"kubectl baton: {err}", err=True)
                continue
            if output == "json":
                typer.echo(json.dumps(document, indent=None if watch else 1))
                continue
            if watch:
                console.clear()
            console.print(jobs_table(document))
            for line in unsettled_lines(document):
                console.print(f"[yellow]{escape(line)}[/yellow]")
    if leaderless is not None:  # the last reading found no leader
        raise typer.Exit(1)


@app.command()
def why(
    pod: Annotated[str, typer.Argument(help="The pod (NAME or NAMESPACE/NAME).")],
    namespace: Annotated[
        str | None,
        typer.Option(
            "--namespace", "-n", help="The pod's namespace; default: the kubeconfig context's."
        ),
    ] = None,
    output: Output = "table",
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    baton_namespace: BatonNamespace = None,
) -> None:
    """Why a pod waits: the scheduler's reason while Pending, the agent's while it waits for a
    turn."""
    from commands.kubectl.why import why as explain

    _connection(kubeconfig, context, baton_namespace)
    namespace = Settings.namespace if namespace is None else namespace
    _check_output(output)
    if "/" in pod:
        namespace, pod = pod.split("/", 1)
    if namespace is not None:
        _check_name("namespace", namespace)
    _check_name("pod", pod, dotted=True)
    with connected() as api:
        if namespace is None:  # as kubectl: the context's namespace, else default
            namespace = api.namespace
            _check_name("the kubeconfig context's namespace", namespace)
        answer = explain(api, namespace, pod, Settings.baton_namespace)
    if output == "json":
        typer.echo(json.dumps(answer, indent=1))
        return
    where = f" on {answer['node']}" if answer.get("node") else ""
    typer.echo(f"{answer['pod']} ({answer['phase']}{where}), {answer['stage']}:")
    for reason in answer["reasons"]:
        typer.echo(f"  {reason}")


@app.command()
def usage(
    namespace: Annotated[
        str | None, typer.Option("--namespace", "-n", help="Only this namespace.")
    ] = None,
    window: Annotated[
        float,
        typer.Option(
            help="Seconds to measure over; 0 = the totals since accounting began.",
            min=0,
            callback=_seconds,
        ),
    ] = 0.0,
    output: Output = "table",
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    baton_namespace: BatonNamespace = None,
) -> None:
    """GPU-seconds and parked byte-seconds per namespace, tenant and tier."""
    from commands.kubectl import usage as accounting
    from commands.kubectl.agents import no_agents

    _connection(kubeconfig, context, baton_namespace)
    namespace = Settings.namespace if namespace is None else namespace
    if namespace is not None:  # else no row matches it: an empty table, as if nothing ran
        _check_name("namespace", namespace)
    _check_output(output)
    with connected() as api:
        if window:  # each node's agent windowed on its own; a node read once is not counted
            first = accounting.read_node_totals(api, Settings.baton_namespace)
            threading.Event().wait(window)
            later = accounting.read_node_totals(api, Settings.baton_namespace)
            totals, missing = accounting.node_windows(first, later)
        else:
            totals, missing = accounting.read_totals(api, Settings.baton_namespace)
    rows = accounting.usage_rows(totals, namespace)
    document: dict[str, Any] = {
        "window_s": window or None,
        "rows": rows,
        "namespaces": accounting.namespace_sums(rows),
        "unread": missing,
    }
    none = no_agents(Settings.baton_namespace)
    if output == "json":
        typer.echo(json.dumps(document, indent=1))
    else:
        title = f"GPU usage over {window:g} s" if window else "GPU usage since accounting began"
        Console().print(accounting.usage_table(rows, title))
        for line in missing:
            if line != none:
                typer.echo(f"not counted: {line}", err=True)
    if none in missing:  # no agent pod when read (at either end of a window): nothing counted
        typer.echo(f"kubectl baton: {none}", err=True)
        raise typer.Exit(NO_AGENT_EXIT)


def main() -> None:
    """The `kubectl-baton` console script."""
    app()

"""`baton status` and `baton events`: what the agents are doing, read as a user would."""

from __future__ import annotations

from typing import Annotated

import typer

from baton.contract import names
from baton.contract.unixsocket import unix_target
from commands.cli.agent_settings import env_of
from commands.cli.options import PORT_MAX

NO_NODE_EXIT = 3
"""The exit status of `baton status --extender` when the extender's inventory lists no node (as
`kubectl baton status`'s when it finds no agent pod)."""


def status(
    url: Annotated[
        str, typer.Option(envvar="BATON_STATUS_URL", help="The agent's HTTP address.")
    ] = f"http://127.0.0.1:{names.PORT_AGENT}",
    extender: Annotated[
        str | None,
        typer.Option(
            envvar="BATON_STATUS_EXTENDER",
            help="Every node: the extender's URL (its /v1/inventory lists the nodes).",
        ),
    ] = None,
    kubeconfig: Annotated[
        str | None,
        typer.Option(
            envvar=names.ENV_KUBECONFIG,
            help="With --extender: find agents (node pod IPs) through this cluster's API.",
        ),
    ] = None,
    baton_namespace: Annotated[
        str,
        typer.Option(
            "--baton-namespace",
            envvar="BATON_STATUS_NAMESPACE",
            help="With --kubeconfig: the namespace Baton is installed in (its agent pods).",
        ),
    ] = names.NAMESPACE,
    agent_port: Annotated[
        int,
        typer.Option(
            envvar="BATON_STATUS_AGENT_PORT",
            min=1,
            max=PORT_MAX,
            help="Agents' HTTP port on nodes.",
        ),
    ] = names.PORT_AGENT,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw JSON.")] = False,
    by: Annotated[
        str,
        typer.Option(
            "--by",
            help="gpu: what each GPU is doing; namespace: each namespace's share of each GPU "
            "against its entitlement (its tenants' summed duty).",
        ),
    ] = "gpu",
) -> None:
    """What each GPU is doing: holder, queue, tenants resident/parked, parked bytes, duty."""
    import http.client
    import json
    import urllib.error

    from commands.status import cluster as cluster_status

    if by not in ("gpu", "namespace"):
        typer.echo(f"baton status: --by is gpu or namespace, not {by!r}", err=True)
        raise typer.Exit(2)
    for flag, given in (("--url", url), ("--extender", extender)):
        if given is not None and (wrong := _not_http_url(given)):
            typer.echo(f"baton status: {flag} {given!r} {wrong}", err=True)
            raise typer.Exit(2)
    if extender is None:
        answer = cluster_status.read_agent(url)
        if isinstance(answer, str):
            typer.echo(f"baton status: {answer}", err=True)
            raise typer.Exit(1)
        if as_json:
            typer.echo(json.dumps(answer, indent=1))
            return
        from commands.status.cluster_view import print_agent

        print_agent(answer, url, by=by)
        return
    addresses: dict[str, str] = {}
    terminating: set[str] = set()
    try:
        if kubeconfig:
            addresses, terminating = cluster_status.agent_addresses(kubeconfig, baton_namespace)
    except cluster_status.ClusterUnreadable as exc:
        typer.echo(f"baton status: cannot find the agents through {kubeconfig}: {exc}", err=True)
        raise typer.Exit(1) from None
    try:
        document = cluster_status.read_cluster(extender, addresses, agent_port, terminating)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        typer.echo(f"baton status: cannot read the inventory at {extender}: {exc}", err=True)
        raise typer.Exit(1) from None
    except http.client.HTTPException as exc:
        typer.echo(
            f"baton status: cannot read the inventory at {extender}: no whole HTTP answer "
            f"({exc!r})",
            err=True,
        )
        raise typer.Exit(1) from None
    if as_json:
        typer.echo(json.dumps(document, indent=1))
    else:
        from commands.status.cluster_view import print_cluster

        print_cluster(document, by=by)
    if not document["nodes"]:  # as `kubectl baton status` finding no agent: a script must know
        unsynced = (
            " (it has not synced with the API server yet)" if document["synced"] is False else ""
        )
        typer.echo(f"baton status: the extender at {extender} lists no node{unsynced}", err=True)
        raise typer.Exit(NO_NODE_EXIT)


def events(
    socket: Annotated[
        str, typer.Option(envvar=names.ENV_AGENT_SOCKET, help="The agent's gRPC unix socket.")
    ] = names.AGENT_SOCKET,
    state_dir: Annotated[
        str,
        typer.Option(
            envvar=env_of("state_dir"), help="The agent's state directory (its watch token)."
        ),
    ] = names.AGENT_STATE_DIR,
    count: Annotated[
        int,
        typer.Option(
            min=0, help="Stop after this many events (after the first line, watching); 0 = never."
        ),
    ] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per event.")] = False,
) -> None:
    """Print the agent's events as they happen: grants, yields, revocations, departures."""
    import grpc

    from agent.core.events import STOPPING
    from agent.wire.handshake import WatchTokenUnreadable, watch_metadata
    from baton._pb import agent_pb2, agent_pb2_grpc
    from commands.status.view import format_event

    try:
        metadata = watch_metadata(socket, state_dir)
    except WatchTokenUnreadable as exc:
        typer.echo(f"baton events: {exc}", err=True)
        raise typer.Exit(1) from None
    except (OSError, ValueError, KeyError) as exc:
        typer.echo(f"baton events: cannot reach the agent at {socket}: {exc}", err=True)
        raise typer.Exit(1) from None
    with grpc.insecure_channel(unix_target(socket)) as channel:
        request = agent_pb2.WatchEventsRequest()
        stream = agent_pb2_grpc.AgentStub(channel).WatchEvents(request, metadata=metadata)
        watching = False
        try:
            for seen, event in enumerate(stream):  # the first is the watch's own: `watching`
                watching = True
                if event.kind == STOPPING:
                    typer.echo(
                        f"baton events: the watch of the agent at {socket} ended: {event.detail}",
                        err=True,
                    )
                    raise typer.Exit(1)
                typer.echo(format_event(event, as_json))
                if count and seen >= count:
                    break
        except grpc.RpcError as exc:
            agent = f"the agent at {socket}"
            what = f"the watch of {agent} ended" if watching else f"cannot watch {agent}"
            typer.echo(f"baton events: {what}: {exc.details()}", err=True)
            raise typer.Exit(1) from None
        finally:
            stream.cancel()


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add `baton status` and `baton events`."""
    app.command("status")(status)
    app.command("events")(events)


def _not_http_url(url: str) -> str:
    """What is wrong with `url` as an HTTP address ("" if nothing): not a URL at all, no
    http(s):// scheme, no host, or a port out of range."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
    except ValueError as exc:  # a bracketed host that is no IP address, or unclosed
        return f"is no URL: {exc}"
    if parts.scheme not in ("http", "https"):
        return f"is no http:// URL: pass e.g. http://{url.split('://')[-1]}"
    try:
        port = parts.port  # ValueError out of 0-65535 or not a number
    except ValueError:
        return f"has a port that is not 1-{PORT_MAX}"
    if not parts.hostname:
        return "names no host"
    if port == 0:
        return f"has a port that is not 1-{PORT_MAX}"
    return ""

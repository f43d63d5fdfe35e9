"""Renders `commands.status.cluster` documents as one rich table, a row per GPU."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from baton.contract.names import MIB
from commands.status.cluster import single_agent_document, troubles
from commands.status.shares import namespace_table
from commands.status.view import tenant_table


def _names(items: list[str]) -> str:
    return "\n".join(items) or "-"


def _bytes_vs_budget(node: dict[str, Any]) -> str:
    parked, budget = node.get("parked_bytes"), node.get("host_memory_budget_bytes")
    if parked is None or not budget:
        return "-"
    return f"{parked / MIB:.0f} / {budget / MIB:.0f} MiB ({100 * parked / budget:.0f}%)"


def _duty(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def gpu_rows_table(document: dict[str, Any], show_node: bool = True) -> Table:
    """Per GPU: holder, queue, resident and parked tenants, duty, the node's parked bytes."""
    table = Table(title="Baton GPUs")
    columns = ["node"] if show_node else []
    columns += ["GPU", "holder", "queue", "resident", "parked", "duty 1 min", "parked/budget"]
    if show_node:
        columns.append("pods (extender)")
    for column in columns:
        table.add_column(column, overflow="fold")
    for node in document.get("nodes", []):
        first = True
        for said in troubles(node):
            cells = [node["name"] if first else ""] if show_node else []
            cells += ["-", f"[red]{escape(said)}[/red]", "", "", "", "", ""]
            table.add_row(*cells, *([""] if show_node else []))
            first = False
        for gpu in node.get("gpus", []):
            name = gpu["uuid"] + ("" if gpu.get("healthy") in (None, True) else " (unhealthy)")
            cells = [node["name"] if first else ""] if show_node else []
            cells += [
                name,
                gpu.get("holder") or "-",
                _names(gpu.get("queue", [])),
                _names(gpu.get("resident", [])),
                _names(gpu.get("parked", [])),
                _duty(gpu.get("duty_last_minute")),
                _bytes_vs_budget(node) if first else "",
            ]
            if show_node:
                cells.append(_names(gpu.get("pods", [])))
            table.add_row(*cells)
            first = False
    return table


def print_cluster(
    document: dict[str, Any], console: Console | None = None, by: str = "gpu"
) -> None:
    """Print the table (per GPU, or with `by="namespace"` each node's namespaces' shares); say
    so when the extender's cache is not synced yet."""
    console = console or Console()
    if document.get("synced") is False:
        console.print("[yellow]the extender has not synced with the API server yet[/yellow]")
    if by == "namespace":
        for node in document.get("nodes", []):
            for said in troubles(node):
                console.print(f"[red]{escape(node['name'])}: {escape(said)}[/red]")
            if not node.get("error"):
                console.print(namespace_table(node.get("namespaces", []), node["name"]))
        return
    console.print(gpu_rows_table(document))


def print_agent(
    status: dict[str, Any], url: str, console: Console | None = None, by: str = "gpu"
) -> None:
    """One agent: its GPUs, then its tenants; or, `by="namespace"`, its namespaces' shares."""
    console = console or Console()
    if by == "namespace":
        document = single_agent_document(status, url)
        console.print(namespace_table(document["nodes"][0]["namespaces"]))
        return
    console.print(gpu_rows_table(single_agent_document(status, url), show_node=False))
    console.print(tenant_table(status))

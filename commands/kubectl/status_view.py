"""`kubectl baton status` as a table: a row per GPU."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from baton.contract.names import MIB
from commands.status.cluster import troubles


def _names(items: list[str]) -> str:
    return "\n".join(items) or "-"


def _parked(node: dict[str, Any]) -> str:
    parked, budget = node.get("parked_bytes"), node.get("host_memory_budget_bytes")
    if parked is None:
        return "-"
    if not budget:
        return f"{parked / MIB:.0f} MiB"
    return f"{parked / MIB:.0f} / {budget / MIB:.0f} MiB ({100 * parked / budget:.0f}%)"


def _duty(gpu: dict[str, Any]) -> str:
    used, owed = gpu.get("duty_last_minute"), gpu.get("duty_entitled")
    shown = "-" if used is None else f"{100 * used:.0f}%"
    return shown if owed is None else f"{shown} / {100 * owed:.0f}%"


def status_table(document: dict[str, Any]) -> Table:
    """Node, GPU, holder, queue, resident, parked, duty used/entitled, parked bytes/budget."""
    table = Table(title="Baton GPUs")
    for column in (
        "node", "GPU", "holder", "queue", "resident", "parked",
        "duty 1 min / entitled", "parked / budget",
    ):  # fmt: skip
        table.add_column(column, overflow="fold")
    for node in document.get("nodes", []):
        first = True
        for said in troubles(node):
            table.add_row(
                node["name"] if first else "", "-", f"[red]{escape(said)}[/red]", *[""] * 5
            )
            first = False
        for index, gpu in enumerate(node.get("gpus", [])):
            healthy = gpu.get("healthy") in (None, True)
            table.add_row(
                node["name"] if first else "",
                gpu["uuid"] + ("" if healthy else " (unhealthy)"),
                gpu.get("holder") or "-",
                _names(gpu.get("queue", [])),
                _names(gpu.get("resident", [])),
                _names(gpu.get("parked", [])),
                _duty(gpu),
                "" if index else _parked(node),  # on the first GPU's row, below any trouble
            )
            first = False
    return table

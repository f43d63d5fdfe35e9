"""Renders an agent's /v1/status document for `baton status`."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def gpu_table(document: dict[str, Any]) -> Table:
    """One row per GPU: holder, token, how long held, queue, tenants."""
    table = Table(
        title=f"GPUs (policy {document.get('policy')}, max hold {document.get('max_hold_s')} s)"
    )
    for column in ("GPU", "holder", "token", "held", "queue", "tenants", "busy"):
        table.add_column(column)
    for gpu, info in document.get("gpus", {}).items():
        held = info.get("held_s")
        queue = [
            q["tenant_id"]
            + (" (resuming)" if q.get("resuming") else "")
            + (f" [blocked: {q['blocked']}]" if q.get("blocked") else "")
            for q in info.get("queue", [])
        ]
        table.add_row(
            gpu,
            info.get("holder") or "-",
            str(info.get("fencing_token", 0)),
            "-" if held is None else f"{held:.1f} s",
            "\n".join(queue) or "-",
            ", ".join(info.get("tenants", [])) or "-",
            f"{info.get('busy_seconds', 0):.1f} s",
        )
    return table


def tenant_table(document: dict[str, Any]) -> Table:
    """One row per tenant."""
    table = Table(title="Tenants")
    for column in ("tenant", "source", "GPUs", "memory MiB", "duty %", "connected"):
        table.add_column(column)
    for tenant_id, info in document.get("tenants", {}).items():
        table.add_row(
            tenant_id,
            info.get("source", ""),
            ", ".join(info.get("gpus", [])),
            str(info.get("gpu_memory_mib", 0)),
            str(info.get("gpu_duty", "")),
            "yes" if info.get("connected") else "no",
        )
    return table


def print_status(document: dict[str, Any], console: Console | None = None) -> None:
    """Print the tables (and the residency layer's report, if any)."""
    console = console or Console()
    console.print(gpu_table(document))
    console.print(tenant_table(document))
    residency = document.get("residency")
    if residency:
        console.print("Residency:", residency)

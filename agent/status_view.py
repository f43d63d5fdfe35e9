"""Renders an agent's /v1/status document for `baton status`."""

from __future__ import annotations

import json
import time
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


def format_event(event: Any, as_json: bool = False) -> str:
    """One line for an agent event (a `baton.agent.v1.Event`)."""
    fields = {
        "kind": event.kind,
        "tenant_id": event.tenant_id,
        "at": event.at,
        "gpus": list(event.gpus),
        "lease_id": event.lease_id,
        "fencing_tokens": dict(event.fencing_tokens),
        "detail": event.detail,
    }
    if as_json:
        return json.dumps(fields)
    when = time.strftime("%H:%M:%S", time.localtime(event.at)) + f".{int(event.at % 1 * 1000):03d}"
    tokens = " ".join(f"{gpu}#{token}" for gpu, token in sorted(event.fencing_tokens.items()))
    parts = [when, f"{event.kind:<13}", event.tenant_id, tokens or ", ".join(event.gpus)]
    return "  ".join(p for p in [*parts, event.detail] if p)

"""Renders an agent's tenants for `baton status` and its events for `baton events`."""

from __future__ import annotations

import json
import time
from typing import Any

from rich.table import Table


def tenant_table(document: dict[str, Any]) -> Table:
    """One row per tenant."""
    table = Table(title="Tenants")
    for column in ("tenant", "source", "GPUs", "memory MiB", "duty %", "connected"):
        table.add_column(column, overflow="fold")
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

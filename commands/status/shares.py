"""`baton status --by namespace`: each namespace's share of each GPU against its entitlement.

The agent's `/v1/status` `accounting` keeps the seconds of turns each tenant held on each GPU
(`gpu_seconds_by_gpu`, ended turns, kept across restarts); a namespace's share of a GPU is its
part of the time that GPU was held, its entitlement the summed `gpu-duty` of its tenants there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.table import Table

from agent.server.accounting import namespace_of


def namespace_shares(status: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per (GPU, namespace): GPU-seconds held, share of the GPU's held time, entitled."""
    tenants = status.get("tenants", {})
    held: dict[str, dict[str, float]] = {}
    for gpu, tenant, seconds in (status.get("accounting") or {}).get("gpu_seconds_by_gpu", []):
        per_ns = held.setdefault(gpu, {})
        per_ns[namespace_of(tenant)] = per_ns.get(namespace_of(tenant), 0.0) + float(seconds)
    entitled: dict[str, dict[str, float]] = {}
    for tenant_id, info in tenants.items():
        for gpu in info.get("gpus", []):
            per_ns = entitled.setdefault(gpu, {})
            ns = namespace_of(tenant_id)
            per_ns[ns] = per_ns.get(ns, 0.0) + int(info.get("gpu_duty") or 0) / 100
    rows = []
    for gpu in sorted(held.keys() | entitled.keys()):
        used, owed = held.get(gpu, {}), entitled.get(gpu, {})
        total = sum(used.values())
        for ns in sorted(used.keys() | owed.keys()):
            seconds = used.get(ns, 0.0)
            rows.append(
                {
                    "gpu": gpu,
                    "namespace": ns,
                    "gpu_seconds": round(seconds, 6),
                    "share": round(seconds / total, 4) if total > 0 else 0.0,
                    "entitled": round(owed[ns], 4) if ns in owed else None,
                }
            )
    return rows


def namespace_table(rows: list[dict[str, Any]], node: str = "") -> Table:
    """The rows as a rich table; `entitled` is `-` for a namespace with no tenant there now."""
    table = Table(title=f"GPU time by namespace{f' on {node}' if node else ''}")
    for column in ("GPU", "namespace", "GPU-seconds", "share of held time", "entitled (duty)"):
        table.add_column(column, overflow="fold")
    for row in rows:
        owed = row["entitled"]
        table.add_row(
            row["gpu"],
            row["namespace"],
            f"{row['gpu_seconds']:.1f}",
            f"{100 * row['share']:.1f}%",
            "-" if owed is None else f"{100 * owed:.0f}%",
        )
    return table

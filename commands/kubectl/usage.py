"""`kubectl baton usage`: GPU-seconds held and parked byte-seconds per namespace, tenant and
tier, summed over every node's agent accounting (totals kept across agent restarts)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rich.table import Table

from baton.contract.names import MIB, NAMESPACE, departed_tenant, is_departed_tenant
from commands.kubectl.agents import agent_pods, no_agents, read_agent
from commands.kubectl.api import Api

Row = tuple[str, str, int]
"""(namespace, tenant, tier)."""


def read_totals(
    api: Api, baton_namespace: str = NAMESPACE
) -> tuple[dict[Row, list[float]], list[str]]:
    """Row → [GPU-seconds, parked byte-seconds] over every agent; and the agents not read."""
    by_node, missing = read_node_totals(api, baton_namespace)
    totals: dict[Row, list[float]] = {}
    for node_totals in by_node.values():
        add_totals(totals, node_totals)
    return totals, missing


def read_node_totals(
    api: Api, baton_namespace: str = NAMESPACE
) -> tuple[dict[str, dict[Row, list[float]]], list[str]]:
    """Each node's agent's totals by row; and the agents not read (why)."""
    by_node: dict[str, dict[Row, list[float]]] = {}
    pods = agent_pods(api, baton_namespace)
    missing = [] if pods else [no_agents(baton_namespace)]
    for node, pod in sorted(pods.items()):
        status = read_agent(api, pod, baton_namespace)
        if isinstance(status, str):
            missing.append(f"{node}: {status}")
            continue
        add_accounting(by_node.setdefault(node, {}), status.get("accounting") or {})
    return by_node, missing


def add_totals(totals: dict[Row, list[float]], more: Mapping[Row, list[float]]) -> None:
    """Add `more`'s rows into `totals`."""
    for key, (held, parked) in more.items():
        row = totals.setdefault(key, [0.0, 0.0])
        row[0] += held
        row[1] += parked


def node_windows(
    before: Mapping[str, Mapping[Row, list[float]]],
    after: Mapping[str, Mapping[Row, list[float]]],
) -> tuple[dict[Row, list[float]], list[str]]:
    """What accrued between two readings, each node's agent windowed on its own (`window`: a
    tenant folded on one node is not one on another) and summed; and the nodes not counted
    because one of the readings lacks them."""
    totals: dict[Row, list[float]] = {}
    for node in sorted(before.keys() & after.keys()):
        add_totals(totals, window(before[node], after[node]))
    skipped = [
        f"{node}: its agent was not read {'at the end' if node in before else 'at the start'}"
        " of the window"
        for node in sorted(before.keys() ^ after.keys())
    ]
    return totals, skipped


def add_accounting(totals: dict[Row, list[float]], accounting: Mapping[str, Any]) -> None:
    """Add one agent's `accounting` ([tenant, namespace, tier, value] rows) into `totals`."""
    for column, field in enumerate(("gpu_seconds", "parked_byte_seconds")):
        for tenant, namespace, tier, value in accounting.get(field) or []:
            row = totals.setdefault((str(namespace), str(tenant), int(tier)), [0.0, 0.0])
            row[column] += float(value)


def window(
    before: Mapping[Row, list[float]], after: Mapping[Row, list[float]]
) -> dict[Row, list[float]]:
    """What accrued between two readings (a restarted agent's totals never go down). A tenant
    in the first and not in the second was folded into its namespace's `<ns>/(departed)` in
    between: what it had before is not counted as that row's use in the window."""
    was = {row: list(values) for row, values in before.items()}
    for (ns, tenant, tier), values in before.items():
        if (ns, tenant, tier) not in after and not is_departed_tenant(tenant):
            into = was.setdefault((ns, departed_tenant(ns), tier), [0.0, 0.0])
            into[0], into[1] = into[0] + values[0], into[1] + values[1]
    out = {}
    for row, (held, parked) in after.items():
        then = was.get(row, [0.0, 0.0])
        out[row] = [max(0.0, held - then[0]), max(0.0, parked - then[1])]
    return out


def usage_rows(totals: Mapping[Row, list[float]], namespace: str | None) -> list[dict[str, Any]]:
    """Rows sorted by namespace, tenant and tier; only `namespace`'s when given."""
    return [
        {
            "namespace": ns,
            "tenant": tenant,
            "tier": tier,
            "gpu_seconds": round(held, 3),
            "parked_byte_seconds": round(parked, 1),
        }
        for (ns, tenant, tier), (held, parked) in sorted(totals.items())
        if namespace is None or ns == namespace
    ]


def namespace_sums(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Per namespace: its tenants' GPU-seconds and parked byte-seconds summed."""
    sums: dict[str, dict[str, float]] = {}
    for row in rows:
        per = sums.setdefault(row["namespace"], {"gpu_seconds": 0.0, "parked_byte_seconds": 0.0})
        per["gpu_seconds"] += row["gpu_seconds"]
        per["parked_byte_seconds"] += row["parked_byte_seconds"]
    return sums


def usage_table(rows: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=title)
    for column in ("namespace", "tenant", "tier", "GPU-seconds", "parked MiB·s"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            row["namespace"],
            row["tenant"],
            str(row["tier"]),
            f"{row['gpu_seconds']:.1f}",
            f"{row['parked_byte_seconds'] / MIB:.1f}",
        )
    return table

"""`kubectl baton usage`: GPU-seconds held and parked byte-seconds per namespace, tenant and
tier, summed over every node's agent accounting (totals kept across agent restarts)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rich.table import Table

from baton.contract.names import MIB, NAMESPACE, departed_tenant, is_departed_tenant
from commands.kubectl.agents import agent_pods, no_agents, read_agents
from commands.kubectl.api import Api

Row = tuple[str, str, int]
"""(namespace, tenant, tier)."""


NodeTotals = dict[str, dict[Row, list[float]]]
"""Node → its agent's totals by row."""

Reading = tuple[NodeTotals, dict[str, str]]
"""One reading of every agent: its totals by node, and why each agent was not read (node → why;
under "" when the namespace has no running agent pod)."""


def read_totals(
    api: Api, baton_namespace: str = NAMESPACE
) -> tuple[dict[Row, list[float]], list[str]]:
    """Row → [GPU-seconds, parked byte-seconds] over every agent; and the agents not read."""
    by_node, unread = read_node_totals(api, baton_namespace)
    totals: dict[Row, list[float]] = {}
    for node_totals in by_node.values():
        add_totals(totals, node_totals)
    return totals, [f"{node}: {why}" if node else why for node, why in unread.items()]


def read_node_totals(api: Api, baton_namespace: str = NAMESPACE) -> Reading:
    """Each node's agent's totals by row; and why each agent was not read."""
    by_node: NodeTotals = {}
    pods = agent_pods(api, baton_namespace)
    unread = {} if pods else {"": no_agents(baton_namespace)}
    for node, status in read_agents(api, pods, baton_namespace).items():
        if isinstance(status, str):
            unread[node] = status
            continue
        add_accounting(by_node.setdefault(node, {}), status.get("accounting") or {})
    return by_node, unread


def add_totals(totals: dict[Row, list[float]], more: Mapping[Row, list[float]]) -> None:
    """Add `more`'s rows into `totals`."""
    for key, (held, parked) in more.items():
        row = totals.setdefault(key, [0.0, 0.0])
        row[0] += held
        row[1] += parked


def node_windows(before: Reading, after: Reading) -> tuple[dict[Row, list[float]], list[str]]:
    """What accrued between two readings, each node's agent windowed on its own (`window`: a
    tenant folded on one node is not one on another) and summed; and one line for each node not
    counted (read at one end of the window only, or at neither), with why."""
    (first, unread_first), (last, unread_last) = before, after
    totals: dict[Row, list[float]] = {}
    for node in sorted(first.keys() & last.keys()):
        add_totals(totals, window(first[node], last[node]))
    skipped = list(dict.fromkeys(u[""] for u in (unread_first, unread_last) if "" in u))
    nodes = (first.keys() ^ last.keys()) | unread_first.keys() | unread_last.keys()
    for node in sorted(nodes - {""}):
        at = "the end" if node in first else "the start" if node in last else "either end"
        whys = dict.fromkeys(
            u.get(node, "no running agent pod")
            for u, read in ((unread_first, first), (unread_last, last))
            if node not in read
        )
        skipped.append(f"{node}: its agent was not read at {at} of the window ({'; '.join(whys)})")
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
    for per in sums.values():  # to the rows' precision: 0.3, not 0.30000000000000004
        per["gpu_seconds"] = round(per["gpu_seconds"], 3)
        per["parked_byte_seconds"] = round(per["parked_byte_seconds"], 1)
    return sums


def usage_table(rows: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=title)
    for column in ("namespace", "tenant", "tier", "GPU-seconds", "parked MiB·s"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(
            row["namespace"],
            row["tenant"],
            str(row["tier"]),
            f"{row['gpu_seconds']:.1f}",
            f"{row['parked_byte_seconds'] / MIB:.1f}",
        )
    return table

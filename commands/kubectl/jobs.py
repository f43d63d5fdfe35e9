"""`kubectl baton jobs`: the cluster coordinator's job turns (which job holds its GPUs on which
nodes, which wait, for how long), read from its leading replica's /v1/status through the API
server's pod proxy."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from baton.contract.names import (
    ANNOTATION_COORDINATOR_LEADER_EPOCH,
    LABEL_COORDINATOR_LEADER,
    PORT_COORDINATOR,
)
from commands.kubectl.api import Api, Forbidden, NoAnswer, PluginError

COORDINATOR_SELECTOR = "app.kubernetes.io/name=baton-coordinator"
"""The coordinator's replicas, as the chart and manifests label them."""


class NoCoordinator(PluginError):
    """The Baton namespace runs no coordinator pod: none is installed there."""


class NoLeader(PluginError):
    """No replica leads now (an election), or the one labelled leader could not be read (it may
    have just failed, its label not yet moved): a watch goes on and reads again."""


def coordinator_status_path(pod: str, namespace: str) -> str:
    """A coordinator replica's /v1/status through the API server's pod proxy."""
    return f"/api/v1/namespaces/{namespace}/pods/{pod}:{PORT_COORDINATOR}/proxy/v1/status"


def leader_pod(api: Api, namespace: str) -> str:
    """The running replica labelled as the leader (the newest epoch's, where a replica that
    lost the lease still carries the label); PluginError saying why there is none."""
    found = api.get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=COORDINATOR_SELECTOR)
    pods = found.get("items") or []
    if not pods:
        raise NoCoordinator(
            f"no Baton coordinator pod ({COORDINATOR_SELECTOR}) in namespace {namespace}: is the "
            "coordinator installed (the chart's coordinator.enabled; --baton-namespace)?"
        )
    leaders = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        running = (pod.get("status") or {}).get("phase") == "Running"
        if running and (meta.get("labels") or {}).get(LABEL_COORDINATOR_LEADER) == "true":
            epoch = (meta.get("annotations") or {}).get(ANNOTATION_COORDINATOR_LEADER_EPOCH, "")
            leaders.append((int(epoch) if epoch.isdigit() else 0, str(meta.get("name", ""))))
    if not leaders:
        names = ", ".join(sorted(str((p.get("metadata") or {}).get("name")) for p in pods))
        raise NoLeader(
            f"no coordinator replica leads now ({names}): an election is under way, or the "
            "replicas cannot reach the API server (their logs say which); ask again"
        )
    return max(leaders)[1]


def read_jobs(api: Api, baton_namespace: str, namespace: str | None = None) -> dict[str, Any]:
    """The leader's job turns as rows (only `namespace`'s jobs where given), and the agents it
    has not heard yet."""
    pod = leader_pod(api, baton_namespace)
    try:
        status = api.get(coordinator_status_path(pod, baton_namespace))
    except Forbidden:
        raise
    except NoAnswer as err:
        raise NoLeader(
            f"coordinator {pod}: no answer within {err.timeout_s:g} s through the API server's "
            "pod proxy (is its node down or cut off?)"
        ) from None
    except PluginError as err:
        raise NoLeader(f"cannot read coordinator {pod}: {err}") from None
    if not isinstance(status, dict):
        raise PluginError(f"coordinator {pod} sent no JSON object")
    if not status.get("leading"):
        raise NoLeader(
            f"coordinator {pod} does not lead any more (an election is under way); ask again"
        )
    rows = [held(key, turn) for key, turn in (status.get("held") or {}).items()]
    rows += [waiting(wait) for wait in status.get("waiting") or []]
    if namespace is not None:
        rows = [row for row in rows if row["job"].startswith(f"{namespace}/")]
    return {
        "coordinator": pod,
        "epoch": status.get("epoch"),
        "jobs": rows,
        "unsettled": status.get("unsettled") or {},
    }


def _nodes(gpus: list[str]) -> list[str]:
    """The nodes of `node/GPU` names."""
    return sorted({gpu.split("/", 1)[0] for gpu in gpus})


def held(key: str, turn: dict[str, Any]) -> dict[str, Any]:
    """A row for a turn held: `namespace/job[@group]` holds its GPUs on its nodes."""
    return {
        "job": key,
        "state": "holding",
        "nodes": sorted(turn.get("nodes") or _nodes(turn.get("gpus") or [])),
        "gpus": len(turn.get("gpus") or []),
        "seconds": turn.get("held_s"),
        "turn_id": turn.get("turn_id"),
    }


def waiting(wait: dict[str, Any]) -> dict[str, Any]:
    """A row for a job waiting for its turn (preparing: its nodes are making room now)."""
    return {
        "job": wait.get("job", ""),
        "state": "preparing" if wait.get("preparing") else "waiting",
        "nodes": _nodes(wait.get("gpus") or []),
        "gpus": len(wait.get("gpus") or []),
        "seconds": wait.get("waited_s"),
        "turn_id": None,
    }


def jobs_table(document: dict[str, Any]) -> Table:
    """A row per job turn: job, state, for how long, nodes, GPUs."""
    title = f"Baton job turns (coordinator {document['coordinator']}, epoch {document['epoch']})"
    table = Table(title=escape(title))
    for column in ("job", "state", "for", "nodes", "GPUs"):
        table.add_column(column, overflow="fold")
    for row in document["jobs"]:
        seconds = row["seconds"]
        table.add_row(
            escape(row["job"]),
            row["state"],
            "-" if seconds is None else f"{seconds:.1f} s",
            escape(", ".join(row["nodes"]) or "-"),
            str(row["gpus"]),
        )
    return table


def unsettled_lines(document: dict[str, Any]) -> list[str]:
    """A line per agent the leader has not heard since it took over: no job's turn is planned
    onto its node until it answers."""
    return [
        f"node {node}: not heard by the leader yet ({why}); no job turn is planned onto it"
        for node, why in sorted(document["unsettled"].items())
    ]

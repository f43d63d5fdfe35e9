"""The Grafana dashboard's job-turn row over a real coordinator's run: the real Prometheus
scrapes a `baton coordinator` process while an llm-d client takes two jobs' turns on two agent
processes (against a real kube-apiserver), and every query of the row returns data as Grafana
would evaluate it, telling what happened. The node-level rows are evaluated over the
end-to-end run (`tests/e2e/test_prometheus.py`), where no coordinator runs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from commands.localnode.controlplane import ControlPlane
from commands.localnode.procs import wait_for
from tests.agent.server.llmd.llmd_client import TimeSliceOrchestratorClient
from tests.coordinator.deployed import TEAM, CoordinatorProcess, members_known, settle
from tests.coordinator.nodes import agent_nodes, job_pod
from tests.e2e.prometheus import MISSING, Prometheus, binary
from tests.test_dashboard import dashboard, queries

ROW = "baton_coordinator_"
"""What the job-turn row's queries read."""


def largest(prometheus: Prometheus, title: str, legend: str) -> float:
    """The largest value the query of panel `title` with `legend` took over the run."""
    (expr,) = [
        t["expr"]
        for p in dashboard()["panels"]
        if p["title"] == title
        for t in p.get("targets", [])
        if t["legendFormat"] == legend
    ]
    return max(prometheus.values_since_start(expr), default=float("nan"))


def test_the_dashboards_job_turn_row_tells_a_coordinators_run(
    control_plane: ControlPlane, core: Any, tmp_path: Path
) -> None:
    path = binary()
    if path is None:
        pytest.skip(MISSING)
    with agent_nodes(control_plane, tmp_path, ["d1", "d2"]) as nodes:
        d1, d2 = nodes
        for pod, node, job in (("dash-a", d1, "dash"), ("dash-b", d2, "dash"), ("other", d1, "o")):
            job_pod(core, TEAM, pod, node, job)
        members_known(nodes, {"d1": {"team/dash-a", "team/other"}, "d2": {"team/dash-b"}})
        leader = CoordinatorProcess(control_plane, tmp_path, "coordinator-d", "dashboard")
        llmd = TimeSliceOrchestratorClient(leader.address)
        leader.process.start()
        prometheus: Prometheus | None = None
        try:
            wait_for("the coordinator leading", lambda: True if leader.serving() else None, 30)
            target = {"baton-coordinator": f"127.0.0.1:{leader.http_port}"}
            prometheus = Prometheus(path, tmp_path / "prometheus", target)
            prometheus.wait_ready()  # scraped before the first grant: its increase is seen
            for job in ("dash", "o", "dash"):
                assert llmd.acquire(job, "", timeout_sec=20)[0]
                prometheus.wait_scraped_after(time.time())  # a scrape while the turn is held
                assert llmd.release(job, "")[0]
            settle(nodes, {"d1": [], "d2": []})
            prometheus.wait_scraped_after(time.time())
            empty = [
                f"{title}: {expr}"
                for title, expr in queries(dashboard())
                if ROW in expr and not prometheus.values_since_start(expr)
            ]
            assert not empty, "queries without data:\n" + "\n".join(empty)
            assert largest(prometheus, "Job turns held and waiting", "held") == 1
            assert largest(prometheus, "Job turns granted and rolled back", "granted") > 0
            assert largest(prometheus, "Job turns granted and rolled back", "rolled back") == 0
            assert 0 < largest(prometheus, "Job handover p50 / p99", "p99") < 10
            assert largest(prometheus, "Coordinator leader", "replicas leading") == 1
            assert largest(prometheus, "Coordinator leader", "epoch") >= 1
        finally:
            llmd.close()
            if prometheus is not None:
                prometheus.stop()
            leader.process.stop()

"""`baton status --by namespace`: each namespace's share of each GPU against its entitlement."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from typer.testing import CliRunner

from commands.cli import app
from commands.status.cluster import cluster_document
from commands.status.cluster_view import print_cluster
from commands.status.shares import namespace_shares
from tests.harness.agent import AgentRunner, TenantProcess

STATUS: dict[str, Any] = {
    "tenants": {
        "team-a/train": {"gpus": ["GPU-0"], "gpu_duty": 60},
        "team-a/eval": {"gpus": ["GPU-0", "GPU-1"], "gpu_duty": 10},
        "team-b/batch": {"gpus": ["GPU-0"], "gpu_duty": 30},
    },
    "accounting": {
        "gpu_seconds_by_gpu": [
            ["GPU-0", "team-a/train", 50.0],
            ["GPU-0", "team-a/eval", 10.0],
            ["GPU-0", "team-b/batch", 40.0],
            ["GPU-1", "team-a/eval", 5.0],
            ["GPU-1", "gone/old", 5.0],
        ]
    },
}


def test_a_namespace_share_is_its_part_of_the_gpus_held_time_against_its_summed_duty() -> None:
    rows = {(r["gpu"], r["namespace"]): r for r in namespace_shares(STATUS)}
    assert rows["GPU-0", "team-a"] == {
        "gpu": "GPU-0",
        "namespace": "team-a",
        "gpu_seconds": 60.0,
        "share": 0.6,
        "entitled": 0.7,
    }
    assert rows["GPU-0", "team-b"]["share"] == 0.4 and rows["GPU-0", "team-b"]["entitled"] == 0.3
    assert rows["GPU-1", "team-a"]["share"] == 0.5 and rows["GPU-1", "team-a"]["entitled"] == 0.1
    assert rows["GPU-1", "gone"]["entitled"] is None, "no tenant there now: nothing entitled"
    assert namespace_shares({}) == []


def test_the_cluster_view_prints_each_nodes_namespaces() -> None:
    inventory = {"synced": True, "nodes": [{"name": "n1", "gpus": []}, {"name": "n2"}]}
    doc = cluster_document(inventory, {"n1": STATUS, "n2": "cannot reach the agent"}, {})
    console = Console(record=True, width=200)
    print_cluster(doc, console, by="namespace")
    text = console.export_text()
    assert "GPU time by namespace on n1" in text and "team-b" in text and "40.0%" in text
    assert "n2: cannot reach the agent" in text


def test_status_by_namespace_reads_a_real_agents_accounting() -> None:
    with AgentRunner() as agent:
        tenant = TenantProcess(agent.socket, "trainer", ["GPU-0"])
        try:
            assert tenant.request("acquire")["ok"]
            assert tenant.request("yield")["ok"]
            result = CliRunner().invoke(
                app,
                ["status", "--url", agent.http_url, "--by", "namespace"],
                env={"COLUMNS": "200"},
            )
        finally:
            tenant.close()
    assert result.exit_code == 0, result.output
    assert "GPU time by namespace" in result.output
    assert "GPU-0" in result.output and "local" in result.output and "100.0%" in result.output


def test_status_by_anything_else_is_refused() -> None:
    result = CliRunner().invoke(app, ["status", "--by", "tenant"])
    assert result.exit_code == 2 and "--by is gpu or namespace" in result.output

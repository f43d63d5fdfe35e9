"""`kubectl baton status` and `usage` as piped output draws them (80 columns): names whole."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from commands.kubectl import cli
from commands.kubectl.api import agent_status_path, inventory_path
from tests.kubectl.fake import GPU_A, DictApi, agent_pod, cluster_routes
from tests.status.tables import table_columns


def test_long_names_are_shown_whole_at_80_columns_as_when_piped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Piped to grep or less, rich draws 80 columns: a real node name, GPU UUID or tenant id was
    cut to 'ip-10-…' or 'resear…', and a GPU's '(unhealthy)' lost, in every row."""
    node, gpu = "ip-10-0-12-34.us-west-2.compute.internal", "GPU-8f2e3a1b-4c5d-6e7f-8091-a2b3c4d5"
    holder, waiter = "research-alpha/llama-70b-finetune-worker-0", "research-beta/mixtral-job-7"
    routes = cluster_routes()
    routes["/api/v1/namespaces/baton-system/pods"]["items"] = [agent_pod(node, "baton-agent-x")]
    routes[inventory_path()]["nodes"][0].update(name=node)
    routes[inventory_path()]["nodes"][0]["gpus"][0].update(uuid=gpu, healthy=False)
    text = json.dumps(routes[agent_status_path("baton-agent-x")])
    text = text.replace(GPU_A, gpu).replace("ml/a", holder).replace("ml/b", waiter)
    routes[agent_status_path("baton-agent-x")] = json.loads(text)
    monkeypatch.setattr(cli.Settings, "make_api", lambda kubeconfig, context: DictApi(routes))
    status = CliRunner().invoke(cli.app, ["status"], env={"COLUMNS": "80"})
    assert status.exit_code == 0, status.output
    assert "…" not in status.output, status.output
    columns = table_columns(status.output)
    assert node in columns[0] and gpu in columns[1], status.output
    assert "(unhealthy)" in columns[1], status.output
    assert holder in columns[2] and waiter in columns[3], status.output
    usage = CliRunner().invoke(cli.app, ["usage"], env={"COLUMNS": "80"})
    assert usage.exit_code == 0, usage.output
    assert "…" not in usage.output and holder in table_columns(usage.output)[1], usage.output

"""What `baton status` and the extender's `/v1/inventory` say while the tenants run."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from typer.testing import CliRunner

from commands.cli import app
from tests.e2e.processes import get_json, poll

if TYPE_CHECKING:
    from tests.e2e.node import Node


def wait_for_tenants(node: Node, tenants: Sequence[str], timeout: float = 30.0) -> None:
    """Until the agent's pod watch has shown it every tenant pod."""

    def known() -> bool | None:
        status = get_json(f"{node.agent_url}/v1/status")
        return True if set(tenants) <= set(status["tenants"]) else None

    poll("every tenant pod known to the agent", known, timeout)


def snapshot(node: Node, timeout: float = 30.0) -> None:
    """Mid-run, once one tenant holds the GPU and one is parked: agent, inventory, status."""

    def busy() -> dict[str, Any] | None:
        for name, container in node.containers.items():
            if container.proc.poll() is not None:
                _out, err = container.proc.communicate()
                raise AssertionError(f"tenant {name} exited early:\n{err}")
        status = get_json(f"{node.agent_url}/v1/status")
        held = any(gpu["holder"] for gpu in status["gpus"].values())
        parked = (status.get("residency") or {}).get("parked_bytes", 0) > 0
        return status if held and parked else None

    node.agent_status = poll("a holder and a parked tenant", busy, timeout)
    node.inventory = get_json(f"{node.extender_url}/v1/inventory")
    node.status_json = baton_status_json(node)
    node.status_table = baton_status_table(node)


def baton_status(node: Node, *extra: str) -> str:
    """`baton status` across the cluster: the extender's inventory, each node's agent."""
    args = ["status", "--extender", node.extender_url, "--kubeconfig", str(node.kubeconfig)]
    args += ["--agent-port", str(node.agent_port), *extra]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "240"})
    assert result.exit_code == 0, result.output
    return result.output


def baton_status_json(node: Node) -> dict[str, Any]:
    return dict(json.loads(baton_status(node, "--json")))


def baton_status_table(node: Node) -> str:
    return baton_status(node)

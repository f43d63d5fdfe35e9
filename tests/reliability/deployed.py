"""The agent's settings as deployed: what `baton agent` makes of a built manifest's args and env.

The agent container's command line and environment come from `kubectl kustomize`; they are
parsed by the real `baton agent` command (its run is replaced by capturing the config), so the
security tests run the agent exactly as a node would.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agent.assembly import AgentConfig
from tests.test_manifests import build

AGENT_OVERLAYS = [".", "overlays/kind", "overlays/nvidia"]
"""The builds that deploy the agent DaemonSet."""
NODE_NAME = "node-1"
"""What the downward API gives the agent as its node's name in these tests."""


def agent_container(overlay: str) -> dict[str, Any]:
    """The agent DaemonSet's `agent` container in the build of manifests/<overlay>."""
    daemonsets = [o for o in build(overlay) if o["kind"] == "DaemonSet"]
    [agent] = [d for d in daemonsets if d["metadata"]["name"] == "baton-agent"]
    containers = agent["spec"]["template"]["spec"]["containers"]
    [container] = [c for c in containers if c["name"] == "agent"]
    return dict(container)


POD_IP = "127.0.0.1"
"""The pod's address as the downward API gives it, here."""


def container_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet gives it: the downward API's node name and
    pod IP filled in, and `$(VAR)` references to earlier variables expanded."""
    env: dict[str, str] = {}
    for var in container.get("env", []):
        field = var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if field == "spec.nodeName":
            env[var["name"]] = NODE_NAME
        elif field == "status.podIP":
            env[var["name"]] = POD_IP
        elif "value" in var:
            value = str(var["value"])
            for name, known in env.items():
                value = value.replace(f"$({name})", known)
            env[var["name"]] = value
    return env


def deployed_agent_config(
    overlay: str, monkeypatch: pytest.MonkeyPatch, scratch: Path
) -> AgentConfig:
    """The `AgentConfig` `baton agent` builds from the manifest's args and env (files the pod
    would mount, such as the coordination token, are made under `scratch`)."""
    from commands.cli import app

    container = agent_container(overlay)
    argv = [*container.get("command", [])[1:], *container.get("args", [])]
    assert argv[:1] == ["agent"], f"the agent container runs {argv}, not `baton agent`"
    seen: list[AgentConfig] = []

    async def capture(config: AgentConfig, early: object = None) -> None:
        seen.append(config)

    monkeypatch.setattr("agent.assembly.run_agent", capture)
    unset: dict[str, str | None] = {
        n: None for n in os.environ if n.startswith("BATON_") or n == "NODE_NAME"
    }  # while the command runs, only the manifest's environment counts
    env = container_env(container)
    if env.get("BATON_COORDINATION_TOKEN_FILE"):  # the Secret's mount: a file of our own here
        token = scratch / "coordination-token"
        token.write_text("a-test-token")
        env["BATON_COORDINATION_TOKEN_FILE"] = str(token)
    if env.get("BATON_AGENT_COORDINATION_LISTEN"):  # its port, free here
        env["BATON_AGENT_COORDINATION_LISTEN"] = f"{POD_IP}:0"
    result = CliRunner().invoke(app, argv, env={**unset, **env})
    assert result.exit_code == 0 and len(seen) == 1, result.output
    return seen[0]

"""The node daemons (`baton deviceplugin`, `baton dra`) tell a value that cannot be right (exit
status 2, as `baton agent` does for the same mistakes) from what the node lacks (1)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from commands.cli import app

MALFORMED = [
    ({"BATON_FAKE_GPUS": "2y10"}, "--fake-gpus '2y10' is neither COUNTxMEMORY_MIB (e.g. 2x81920)"),
    ({"BATON_FAKE_GPUS": "81920x2"}, "--fake-gpus '81920x2': at most 64 GPUs per node"),
    ({"BATON_HOST_MEMORY_BUDGET": "lots"}, "--host-memory-budget 'lots': give MiB (65536) or a"),
    ({"BATON_HOST_MEMORY_BUDGET": "-5"}, "--host-memory-budget '-5': MiB must be 0 or more"),
    ({"BATON_HOST_MEMORY_BUDGET": "150%"}, "--host-memory-budget '150%': the share must be"),
    ({"BATON_IGNORED_XIDS": "13,x"}, "--ignored-xids '13,x' must be comma-separated integers"),
    ({"NODE_NAME": "Node_1"}, "--node-name: node 'Node_1' is not a Kubernetes name"),
]


def _env(tmp_path: Path, **given: str) -> dict[str, str]:
    """A node daemon's environment; its kubeconfig is missing, so nothing can start."""
    return {
        "NODE_NAME": "n",
        "BATON_FAKE_GPUS": "1x1024",
        "BATON_KUBECONFIG": str(tmp_path / "missing"),
        "BATON_DEVICE_PLUGIN_DIR": str(tmp_path),
    } | given


@pytest.mark.parametrize("command", ["deviceplugin", "dra"])
@pytest.mark.parametrize(("given", "said"), MALFORMED, ids=lambda v: str(v))
def test_a_value_that_cannot_be_right_is_a_usage_mistake(
    command: str, given: dict[str, str], said: str, tmp_path: Path
) -> None:
    """They exited 1, as for a node without GPUs, for a malformed flag whose twin the agent
    refuses with 2: a script (or a rollout's check) could not tell a typo from the node."""
    result = CliRunner().invoke(app, [command], env=_env(tmp_path, **given))
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # no traceback
    assert result.output.startswith(f"baton {command}: {said}"), result.output
    assert len(result.output.splitlines()) == 1, result.output


@pytest.mark.parametrize("command", ["deviceplugin", "dra"])
def test_a_kubeconfig_it_cannot_read_is_what_the_node_lacks(command: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, [command], env=_env(tmp_path))
    assert result.exit_code == 1, result.output
    missing = tmp_path / "missing"
    assert result.output == f"baton {command}: kubeconfig file '{missing}' does not exist\n"


def test_the_agent_refuses_the_same_malformed_fake_gpus_with_the_same_status(
    tmp_path: Path,
) -> None:
    where = ["--socket", str(tmp_path / "a.sock"), "--state-dir", str(tmp_path / "state")]
    fake = ["--backend", "fake", "--fake-dir", str(tmp_path / "gpus"), "--http-port", "0"]
    result = CliRunner().invoke(app, ["agent", *where, *fake], env={"BATON_FAKE_GPUS": "2y10"})
    assert result.exit_code == 2, result.output
    assert "--fake-gpus '2y10'" in result.output

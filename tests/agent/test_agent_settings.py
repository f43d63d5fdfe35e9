"""`baton agent`'s options are described once (`AgentSettings`): one env var each, read into
one settings object, and the only env vars the manifests and the chart give the agent."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml
from typer.testing import CliRunner

import commands.cli
from commands.cli.agent_settings import AgentSettings, flag_of

ROOT = Path(__file__).resolve().parents[2]
FIELDS = dataclasses.fields(AgentSettings)
ENVS = {flag_of(f).env for f in FIELDS}
AN_ENV_VALUE = {list: "a=GPU-0", bool: "true", float: "0.5", int: "7", str: "set"}
"""A value unlike any default, by the field's type (the first that its annotation names), as
an env var spells it."""


def _command() -> Any:
    group = typer.main.get_command(commands.cli.app)
    assert isinstance(group, typer.main.TyperGroup)
    return group.commands["agent"]


def test_every_option_has_exactly_one_env_var_of_its_own() -> None:
    assert len(ENVS) == len(FIELDS), "two settings share an env var"
    params = {p.name: p for p in _command().params if p.name != "help"}
    assert sorted(params) == sorted(f.name for f in FIELDS)
    for each in FIELDS:
        param = params[each.name]
        assert param.envvar == flag_of(each).env, each.name
        assert param.opts == [f"--{each.name.replace('_', '-')}"], each.name


def _parsed(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> AgentSettings:
    seen: list[AgentSettings] = []

    def capture(settings: AgentSettings) -> Any:
        seen.append(settings)
        raise typer.Exit(0)

    monkeypatch.setattr("commands.cli.agent._agent_config", capture)
    monkeypatch.setattr("commands.cli.agent.setup_logging", lambda level: None)
    for name in ENVS:
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(commands.cli.app, ["agent"], env=env)
    assert result.exit_code == 0, result.output
    return seen[0]


@pytest.mark.parametrize("each", FIELDS, ids=lambda f: f.name)
def test_each_env_var_sets_its_setting(each: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    kind = next(t for t in AN_ENV_VALUE if t.__name__ in str(each.type))
    value = _parsed({flag_of(each).env: AN_ENV_VALUE[kind]}, monkeypatch)
    default = AgentSettings()
    changed = [f.name for f in FIELDS if getattr(value, f.name) != getattr(default, f.name)]
    assert changed == [each.name]


def _agent_env_in_manifests() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "manifests").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict):  # a JSON patch's list of operations
                continue
            template = (doc.get("spec") or {}).get("template") or {}
            for container in (template.get("spec") or {}).get("containers") or []:
                if container.get("name") == "agent":
                    names = {e["name"] for e in container.get("env") or []}
                    found.setdefault(str(path.relative_to(ROOT)), set()).update(names)
    return found


_CHART_ENV = re.compile(r'(?:- name: |"name" "|"env" ")(BATON_\w+|NODE_NAME)\b')


def test_the_manifests_and_the_chart_give_the_agent_only_env_vars_it_reads() -> None:
    given = _agent_env_in_manifests()
    assert "manifests/base/agent.yaml" in given
    chart = ROOT / "charts" / "baton" / "templates" / "agent.yaml"
    given[str(chart.relative_to(ROOT))] = set(_CHART_ENV.findall(chart.read_text()))
    for path, names in given.items():
        ours = {n for n in names if n.startswith("BATON_") or n == "NODE_NAME"}
        assert ours, f"{path}: no agent env var found (has the file's shape changed?)"
        assert ours <= ENVS, f"{path} sets {sorted(ours - ENVS)}, which `baton agent` never reads"


def test_the_chart_check_sees_every_way_the_template_sets_a_variable() -> None:
    text = (
        '- name: BATON_AGENT_SOCKET_MODE\n(dict "name" "BATON_AGENT_MAX_HOLD" "value" .x)\n'
        '(dict "root" . "env" "BATON_AGENT_HTTP_HOST")\n'
    )
    assert _CHART_ENV.findall(text) == [
        "BATON_AGENT_SOCKET_MODE",
        "BATON_AGENT_MAX_HOLD",
        "BATON_AGENT_HTTP_HOST",
    ]

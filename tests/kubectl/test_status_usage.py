"""`kubectl baton status` and `usage` over a stand-in API server (documents shaped as the
agent's and the extender's)."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from typer.testing import CliRunner

from commands.kubectl import cli
from commands.kubectl.agents import read_cluster
from commands.kubectl.api import NoAnswer, PluginError, agent_status_path, inventory_path
from commands.kubectl.usage import namespace_sums, read_totals, usage_rows, window
from tests.kubectl.fake import (
    FORBIDDEN_PROXY,
    GIB,
    GPU_A,
    GPU_B,
    DictApi,
    agent_pod,
    agent_status,
    cluster_routes,
)


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch):
    """Invoke the plugin's CLI against `routes`."""

    def invoke(routes: dict, *args: str):
        monkeypatch.setattr(cli.Settings, "make_api", lambda kubeconfig, context: DictApi(routes))
        return CliRunner().invoke(cli.app, list(args), env={"COLUMNS": "200"})

    return invoke


def test_status_joins_agents_and_inventory_through_the_proxy() -> None:
    api = DictApi(cluster_routes())
    (node,) = read_cluster(api)["nodes"]
    gpus = {g["uuid"]: g for g in node["gpus"]}
    assert gpus[GPU_A]["holder"] == "ml/a" and gpus[GPU_A]["queue"] == ["ml/b"]
    assert gpus[GPU_A]["resident"] == ["ml/a", "ml/b"] and gpus[GPU_A]["duty_entitled"] == 0.8
    assert gpus[GPU_B]["parked"] == ["ops/c"] and gpus[GPU_B]["duty_entitled"] == 1.0
    assert (node["parked_bytes"], node["host_memory_budget_bytes"]) == (2 * GIB, 8 * GIB)
    paths = [p for p, _ in api.asked]
    assert agent_status_path("baton-agent-x") in paths and inventory_path() in paths
    assert all(p.startswith("/api") for p in paths), "everything goes through the API server"


def test_status_without_an_extender_still_shows_every_agent() -> None:
    routes = cluster_routes()
    del routes[inventory_path()]
    document = read_cluster(DictApi(routes))
    assert [g["uuid"] for g in document["nodes"][0]["gpus"]] == [GPU_A, GPU_B]
    assert document["extender_error"].startswith("extender: not found")


def test_status_table_json_and_watch(run) -> None:
    table = run(cluster_routes(), "status")
    assert table.exit_code == 0, table.output
    assert "ml/a" in table.output and "2048 / 8192 MiB (25%)" in table.output
    assert "40% / 80%" in table.output
    as_json = run(cluster_routes(), "status", "-o", "json")
    assert json.loads(as_json.output)["nodes"][0]["name"] == "n1"
    watched = run(
        cluster_routes(), "status", "-o", "json", "--watch", "--count", "2", "--interval", "0.1"
    )
    assert [json.loads(line)["nodes"][0]["name"] for line in watched.output.splitlines()] == [
        "n1"
    ] * 2


def test_status_shows_what_the_extender_says_is_wrong_with_a_node(run) -> None:
    routes = cluster_routes()
    problem = "node annotation baton.dev/gpus is not JSON"
    routes[inventory_path()]["nodes"][0].update(problem=problem, gpus=[])
    table = run(routes, "status")
    assert table.exit_code == 0, table.output
    assert f"extender: {problem}" in table.output
    # the agent answered: its parked bytes against the budget are shown all the same (the
    # trouble's row took the node's first row, and the figure was left out)
    assert "2048 / 8192 MiB (25%)" in table.output
    assert json.loads(run(routes, "status", "-o", "json").output)["nodes"][0]["problem"] == problem


def test_a_node_whose_agent_is_silent_has_no_entitled_duty_shown_as_0(run) -> None:
    """Its agent unread, a node's tenants are not known: the table said '- / 0%' and the JSON
    duty_entitled 0.0 for each of its GPUs, as if no tenant there were owed any GPU time."""
    routes = cluster_routes()
    routes["/api/v1/namespaces/baton-system/pods"]["items"].append(agent_pod("n2", "agent-y"))
    routes[agent_status_path("agent-y")] = NoAnswer("no answer within 10 s", 10.0)
    gpu = {"uuid": "GPU-fake-n2-0", "index": 0, "healthy": True, "tenants": []}
    routes[inventory_path()]["nodes"].append({"name": "n2", "gpus": [gpu]})
    document = json.loads(run(routes, "status", "-o", "json").output)
    n1, n2 = document["nodes"]
    assert "cannot read agent agent-y: no answer within 10 s" in n2["error"]
    assert [g["duty_entitled"] for g in n2["gpus"]] == [None]
    assert [g["duty_entitled"] for g in n1["gpus"]] == [0.8, 1.0]
    table = run(routes, "status")
    assert table.exit_code == 0, table.output
    (row,) = [line.split("│") for line in table.output.splitlines() if "GPU-fake-n2-0" in line]
    assert row[7].strip() == "-", table.output


def test_an_agent_pod_shutting_down_is_read_and_marked_terminating(run) -> None:
    """During a rolling update the old agent pod serves for its grace period before the new one
    runs: n1's was shown as 'no running agent pod' (baton status --kubeconfig read it); where
    both run (n2), the new one is read, whichever the API lists first."""
    routes = cluster_routes()
    old = agent_pod("n1", "baton-agent-x")
    old["metadata"]["deletionTimestamp"] = "2024-05-01T10:00:00Z"
    leaving = agent_pod("n2", "agent-old")
    leaving["metadata"]["deletionTimestamp"] = "2024-05-01T10:00:00Z"
    pods = [old, agent_pod("n2", "agent-new"), leaving]
    routes["/api/v1/namespaces/baton-system/pods"]["items"] = pods
    routes[agent_status_path("agent-new")] = agent_status()
    routes[agent_status_path("agent-old")] = PluginError("the old agent is not the one to read")
    routes[inventory_path()]["nodes"].append({"name": "n2", "gpus": []})
    document = json.loads(run(routes, "status", "-o", "json").output)
    n1, n2 = document["nodes"]
    assert n1["error"] is None and n1["agent_terminating"] is True
    assert n1["gpus"][0]["holder"] == "ml/a" and n1["gpus"][0]["duty_entitled"] == 0.8
    assert n2["error"] is None and n2["agent_terminating"] is False
    assert n2["agent"] == "pod baton-system/agent-new"
    table = run(routes, "status")
    assert table.exit_code == 0, table.output
    assert "no running agent pod" not in table.output and "2048 / 8192 MiB" in table.output
    assert "agent pod terminating" in table.output and table.output.count("terminating") == 1
    assert read_totals(DictApi(routes))[1] == []  # usage counts it too


def test_status_says_when_the_extenders_inventory_is_not_synced_yet(run) -> None:
    """Before its first sync (just started, or a new replica), the extender's inventory lacks
    nodes' GPU health and problems: the table showed every GPU healthy and said nothing (as
    `baton status --extender` does say)."""
    routes = cluster_routes()
    routes[inventory_path()]["synced"] = False
    table = run(routes, "status")
    assert table.exit_code == 0, table.output
    assert "the extender has not synced with the API server yet" in table.output
    assert "not synced" not in run(cluster_routes(), "status").output


def test_a_missing_permission_is_one_line_naming_it(run) -> None:
    routes = cluster_routes()
    routes[agent_status_path("baton-agent-x")] = FORBIDDEN_PROXY
    result = run(routes, "status")
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        'kubectl baton: forbidden: pods "baton-agent-x" is forbidden: User "bob" cannot get'
        ' resource "pods/proxy" in API group "" in the namespace "baton-system"'
    ]


@pytest.mark.parametrize("command", ["status", "usage"])
@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
def test_the_connection_options_are_taken_before_the_command_or_after_it(
    monkeypatch: pytest.MonkeyPatch, command: str, after: bool
) -> None:
    """kubectl users write `kubectl baton status --context X`: it was refused (No such option),
    only `kubectl baton --context X status` worked. Given after the command, an option wins over
    KUBECONFIG and over the same option given before it."""
    routes = cluster_routes()
    routes["/api/v1/namespaces/bns/pods"] = routes.pop("/api/v1/namespaces/baton-system/pods")
    for path in (agent_status_path("baton-agent-x"), inventory_path()):
        routes[path.replace("/baton-system/", "/bns/")] = routes.pop(path)
    made: list[tuple[str | None, str | None]] = []

    def make_api(kubeconfig: str | None, context: str | None) -> DictApi:
        made.append((kubeconfig, context))
        return DictApi(routes)

    monkeypatch.setattr(cli.Settings, "make_api", make_api)
    given = ["--kubeconfig", "/k", "--context", "c", "--baton-namespace", "bns", "-n", "ml"]
    if after:
        args = ["--context", "before", "--baton-namespace", "nons", command, *given[:6]]
        args += ["-n", "ml"] if command == "usage" else []
    else:
        args = [*given, command]
    result = CliRunner().invoke(cli.app, [*args, "-o", "json"], env={"KUBECONFIG": "/env"})
    assert result.exit_code == 0, result.output
    assert made == [("/k", "c")]
    if command == "usage":
        assert list(json.loads(result.stdout)["namespaces"]) == ["ml"]
    else:
        assert json.loads(result.stdout)["nodes"][0]["gpus"][0]["holder"] == "ml/a"


def test_usage_sums_per_namespace_tenant_and_tier(run) -> None:
    totals, missing = read_totals(DictApi(cluster_routes()))
    assert missing == []
    rows = usage_rows(totals, "ops")
    assert rows == [
        {"namespace": "ops", "tenant": "ops/c", "tier": 1, "gpu_seconds": 2.0,
         "parked_byte_seconds": 4.0 * GIB}
    ]  # fmt: skip
    result = run(cluster_routes(), "usage", "-o", "json")
    assert json.loads(result.output)["namespaces"]["ml"]["gpu_seconds"] == 15.0


def test_a_namespaces_sums_keep_the_rows_precision() -> None:
    rows = [
        {"namespace": "ml", "gpu_seconds": s, "parked_byte_seconds": b}
        for s, b in ((0.1, 0.1), (0.2, 0.2))
    ]
    assert namespace_sums(rows) == {"ml": {"gpu_seconds": 0.3, "parked_byte_seconds": 0.3}}


def test_usage_over_a_window_counts_what_accrued() -> None:
    before = {("ml", "ml/a", 0): [10.0, 0.0]}
    after = {("ml", "ml/a", 0): [12.5, 3.0], ("ops", "ops/c", 1): [1.0, 0.0]}
    assert window(before, after) == {("ml", "ml/a", 0): [2.5, 3.0], ("ops", "ops/c", 1): [1.0, 0.0]}


def test_usage_over_a_window_counts_only_what_a_tenant_folded_inside_it_used() -> None:
    """ml/a used 2.5 s more, then its agent folded it into ml/(departed) (the row gone, its
    12.5 s added there); ops/c was folded having used nothing in the window."""
    before = {
        ("ml", "ml/a", 0): [10.0, 4.0],
        ("ml", "ml/(departed)", 0): [100.0, 1.0],
        ("ml", "ml/b", 1): [1.0, 0.0],
        ("ops", "ops/c", 0): [3.0, 0.0],
    }
    after = {
        ("ml", "ml/(departed)", 0): [112.5, 5.0],
        ("ml", "ml/b", 1): [2.0, 0.0],
        ("ops", "ops/(departed)", 0): [3.0, 0.0],
    }
    assert window(before, after) == {
        ("ml", "ml/(departed)", 0): [2.5, 0.0],
        ("ml", "ml/b", 1): [1.0, 0.0],
        ("ops", "ops/(departed)", 0): [0.0, 0.0],
    }


def test_a_namespace_with_no_agent_pod_is_one_line_on_stderr_and_exit_status_3(run) -> None:
    """No node runs an agent (or --baton-namespace names the wrong namespace): `status` and
    `usage` still print what they read, and a script checking the exit status is not told all is
    well (it was 0)."""
    routes: dict[str, Any] = {"/api/v1/namespaces/nons/pods": {"items": []}}
    said = (
        "kubectl baton: no running Baton agent pod (app.kubernetes.io/name=baton-agent) in "
        "namespace nons: is Baton installed there (--baton-namespace)?"
    )
    for args in (
        ("status",),
        ("status", "-o", "json"),
        ("usage",),
        ("usage", "-o", "json"),
        ("usage", "--window", "0.01"),
    ):
        answer = run(routes, "--baton-namespace", "nons", *args)
        assert answer.exit_code == cli.NO_AGENT_EXIT == 3, (args, answer.output)
        assert answer.stderr.splitlines() == [said], args
        assert "Traceback" not in answer.output, args
    as_json = json.loads(run(routes, "--baton-namespace", "nons", "status", "-o", "json").stdout)
    assert as_json["agents_error"] == said.removeprefix("kubectl baton: ")
    assert as_json["nodes"] == []
    watched = run(
        routes, "--baton-namespace", "nons", "status", "-w", "--count", "2", "--interval", "0.1"
    )
    assert watched.exit_code == 3 and watched.stderr.splitlines() == [said] * 2
    assert "agents_error" not in read_cluster(DictApi(cluster_routes()))
    assert run(cluster_routes(), "status").exit_code == 0


class Readings(DictApi):
    """Routes whose answer is a list are answered in turn (the last one from then on)."""

    def get(self, path: str, **params: str) -> Any:
        answer = self.routes.get(path)
        if isinstance(answer, list):
            asked = sum(p == path for p, _ in self.asked)
            self.asked.append((path, params))
            step = answer[min(asked, len(answer) - 1)]
            if isinstance(step, PluginError):
                raise step
            return step
        return super().get(path, **params)


@pytest.mark.parametrize("output", ["json", "table"])
def test_usage_over_a_window_counts_each_agent_over_its_own_readings(
    monkeypatch: pytest.MonkeyPatch, output: str
) -> None:
    """n1's ml/a used 2.5 s and was folded; n2's agent answered only the second reading (its
    totals since accounting began are not the window's); n3's only the first (its tenants are
    not folded ones); n4's neither; n5's agent pod ran only at the end: each agent is windowed
    on its own, and each node not counted is named once, with why."""

    def agent(*rows: list[Any]) -> dict[str, Any]:
        return {"accounting": {"gpu_seconds": list(rows), "parked_byte_seconds": []}}

    busy = PluginError("the agent did not answer")
    pods = [agent_pod(n, f"baton-agent-{n}") for n in ("n1", "n2", "n3", "n4", "n5")]
    routes: dict[str, Any] = {
        "/api/v1/namespaces/baton-system/pods": [{"items": pods[:4]}, {"items": pods}],
        agent_status_path("baton-agent-n1"): [
            agent(["ml/a", "ml", 0, 10.0]),
            agent(["ml/(departed)", "ml", 0, 12.5]),
        ],
        agent_status_path("baton-agent-n2"): [busy, agent(["ml/b", "ml", 0, 100.0])],
        agent_status_path("baton-agent-n3"): [agent(["ml/z", "ml", 0, 50.0]), busy],
        agent_status_path("baton-agent-n4"): [busy],
        agent_status_path("baton-agent-n5"): [agent(["ml/y", "ml", 0, 7.0])],
    }
    monkeypatch.setattr(cli.Settings, "make_api", lambda kubeconfig, context: Readings(routes))
    result = CliRunner().invoke(cli.app, ["usage", "--window", "0.01", "-o", output])
    assert result.exit_code == 0, result.output
    why = "cannot read agent baton-agent-{}: the agent did not answer"
    unread = [
        f"n2: its agent was not read at the start of the window ({why.format('n2')})",
        f"n3: its agent was not read at the end of the window ({why.format('n3')})",
        f"n4: its agent was not read at either end of the window ({why.format('n4')})",
        "n5: its agent was not read at the start of the window (no running agent pod)",
    ]
    if output == "table":
        assert result.stderr.splitlines() == [f"not counted: {line}" for line in unread]
        return
    document = json.loads(result.stdout)
    assert [(r["tenant"], r["gpu_seconds"]) for r in document["rows"]] == [("ml/(departed)", 2.5)]
    assert document["unread"] == unread


class Together(DictApi):
    """Each agent answers only once every agent has been asked (a Barrier, bounded): agents
    read one after another never all answer."""

    def __init__(self, routes: dict[str, Any], agents: int) -> None:
        super().__init__(routes)
        self.barrier = threading.Barrier(agents, timeout=5)

    def get(self, path: str, **params: str) -> Any:
        if path.endswith("/proxy/v1/status"):
            try:
                self.barrier.wait()
            except threading.BrokenBarrierError:
                raise PluginError("asked alone: the agents were read one at a time") from None
        return super().get(path, **params)


def test_every_agent_is_read_at_once_so_silent_nodes_cost_one_timeout_not_one_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With nodes down, each agent read waits out the request timeout: one after another,
    `status` and `usage` would take that timeout times the nodes down."""
    nodes = ("n1", "n2", "n3")
    routes: dict[str, Any] = {
        "/api/v1/namespaces/baton-system/pods": {
            "items": [agent_pod(n, f"baton-agent-{n}") for n in nodes]
        },
        **{agent_status_path(f"baton-agent-{n}"): cluster_routes()[
            agent_status_path("baton-agent-x")] for n in nodes},
    }  # fmt: skip
    monkeypatch.setattr(
        cli.Settings, "make_api", lambda kubeconfig, context: Together(routes, len(nodes))
    )
    status = CliRunner().invoke(cli.app, ["status", "-o", "json"])
    assert status.exit_code == 0, status.output
    assert [(n["name"], n["error"]) for n in json.loads(status.output)["nodes"]] == [
        (n, None) for n in nodes
    ]
    usage = CliRunner().invoke(cli.app, ["usage", "-o", "json"])
    assert usage.exit_code == 0, usage.output
    assert json.loads(usage.output)["unread"] == []
    assert json.loads(usage.output)["namespaces"]["ml"]["gpu_seconds"] == 45.0


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("usage", "--window", "inf"), "inf: must be a finite number of seconds"),
        (("usage", "--window", "nan"), "greater than or equal to 0"),
        (("status", "-w", "--interval", "inf"), "inf: must be a finite number of seconds"),
    ],
)
def test_a_wait_that_cannot_end_is_refused_as_a_bad_value(
    run, args: tuple[str, ...], said: str
) -> None:
    answer = run(cluster_routes(), *args)
    assert answer.exit_code == 2, answer.output
    assert said in answer.output and "Traceback" not in answer.output

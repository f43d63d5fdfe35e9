"""`baton status`: joining the extender's inventory with agents, the table, one real agent."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from agent.client import Baton
from agent.parking.setup import ParkingOptions
from baton.contract.names import MIB, fake_gpu_uuid
from commands.cli import app
from commands.status.cluster import cluster_document, gpu_summary
from commands.status.cluster_view import gpu_rows_table
from tests.harness.agent import AgentRunner, TenantProcess, short_tmpdir
from tests.harness.fakeapi import FakeApiServer
from tests.status.tables import table_columns

GPU = "GPU-0"
FORBIDDEN = 'nodes is forbidden: User "bob" cannot list resource "nodes" in API group ""'
INVENTORY = {
    "synced": True,
    "nodes": [
        {
            "name": "n1",
            "hostMemoryBudgetMiB": 1024,
            "gpus": [
                {
                    "uuid": GPU,
                    "index": 0,
                    "healthy": True,
                    "tenants": [{"uid": "u1", "pod": "ns/a"}, {"uid": "u2", "pod": "ns/b"}],
                },
                {"uuid": "GPU-1", "index": 1, "healthy": False, "tenants": []},
            ],
        },
        {"name": "n2", "hostMemoryBudgetMiB": 0, "gpus": []},
    ],
}
AGENT = {
    "gpus": {
        GPU: {
            "holder": "ns/a",
            "fencing_token": 7,
            "queue": [{"tenant_id": "ns/b"}],
            "tenants": ["ns/a", "ns/b"],
            "duty_last_minute": 0.5,
        }
    },
    "residency": {
        "parked_bytes": 256 * MIB,
        "host_memory_budget_bytes": 1024 * MIB,
        "tenants": {"ns/a": {"gpus": {GPU: "resident"}}, "ns/b": {"gpus": {GPU: "parked"}}},
    },
}


def test_a_gpu_row_says_who_holds_waits_and_where_memory_is() -> None:
    row = gpu_summary(GPU, AGENT)
    assert row["holder"] == "ns/a" and row["queue"] == ["ns/b"]
    assert row["resident"] == ["ns/a"] and row["parked"] == ["ns/b"]
    assert row["duty_last_minute"] == 0.5
    assert gpu_summary("GPU-unknown", AGENT)["tenants"] == []


def test_every_inventory_node_is_joined_with_its_agent_or_the_reason_it_is_missing() -> None:
    urls = {"n1": "http://10.0.0.1:9460", "n2": "http://10.0.0.2:9460"}
    doc = cluster_document(INVENTORY, {"n1": AGENT, "n2": "cannot reach the agent"}, urls)
    n1, n2 = doc["nodes"]
    assert n1["error"] is None and n2["error"] == "cannot reach the agent"
    assert n1["parked_bytes"] == 256 * MIB and n1["annotated_budget_mib"] == 1024
    gpu0, gpu1 = n1["gpus"]
    assert gpu0["pods"] == ["ns/a", "ns/b"] and gpu0["parked"] == ["ns/b"]
    assert gpu1["healthy"] is False and gpu1["holder"] is None
    console = Console(record=True, width=200)
    console.print(gpu_rows_table(doc))
    text = console.export_text()
    assert "256 / 1024 MiB (25%)" in text and "50%" in text and "(unhealthy)" in text
    assert text.count("n2") == 1 and "cannot reach the agent" in text


def test_a_node_the_extender_cannot_read_shows_its_complaint() -> None:
    problem = "node has no baton.dev/gpus annotation: Baton's device plugin or DRA driver..."
    inventory = {"nodes": [{"name": "n3", "problem": problem, "gpus": []}]}
    doc = cluster_document(inventory, {"n3": "cannot reach the agent"}, {})
    (n3,) = doc["nodes"]
    assert n3["problem"] == problem
    console = Console(record=True, width=300)
    console.print(gpu_rows_table(doc))
    text = console.export_text()
    assert f"extender: {problem}" in text and "cannot reach the agent" in text
    assert text.count("n3") == 1


def test_status_of_one_agent_shows_its_gpus_and_tenants() -> None:
    with AgentRunner() as agent:
        tenant = TenantProcess(agent.socket, "trainer", [GPU])
        try:
            assert tenant.request("acquire")["ok"]
            result = CliRunner().invoke(
                app, ["status", "--url", agent.http_url], env={"COLUMNS": "200"}
            )
            raw = CliRunner().invoke(app, ["status", "--url", agent.http_url, "--json"])
        finally:
            tenant.close()
    assert result.exit_code == 0, result.output
    assert GPU in result.output and "local/trainer" in result.output
    document: dict[str, Any] = json.loads(raw.output)
    assert document["gpus"][GPU]["holder"] == "local/trainer"


def test_status_of_one_agent_lists_every_gpu_it_has_before_any_tenant_names_one() -> None:
    workdir = short_tmpdir()
    parking = ParkingOptions(backend="fake", fake_gpus="2x100", fake_dir=f"{workdir}/gpus")
    with (
        AgentRunner(workdir, parking=parking) as agent,
        Baton(agent.socket, [fake_gpu_uuid(1)], name="trainer") as baton,
    ):
        baton.acquire()
        document = agent.status()
        result = CliRunner().invoke(
            app, ["status", "--url", agent.http_url], env={"COLUMNS": "200"}
        )
    idle, held = document["gpus"][fake_gpu_uuid(0)], document["gpus"][fake_gpu_uuid(1)]
    assert idle["holder"] is None and idle["queue"] == [] and idle["duty_last_minute"] == 0
    assert held["holder"] == "local/trainer" and held["fencing_token"] == 1
    rows = [line for line in result.output.splitlines() if "GPU-fake-" in line]
    assert [fake_gpu_uuid(0) in rows[0], fake_gpu_uuid(1) in rows[1]] == [True, True], rows
    assert "local/trainer" not in rows[0] and "local/trainer" in rows[1]


def test_status_says_which_agent_it_cannot_reach() -> None:
    result = CliRunner().invoke(app, ["status", "--url", "http://127.0.0.1:9"])
    assert result.exit_code == 1
    assert "cannot reach the agent at http://127.0.0.1:9" in result.output


@pytest.mark.parametrize(
    ("flag", "given", "problem"),
    [
        ("--url", "127.0.0.1:9460", "is no http:// URL: pass e.g. http://127.0.0.1:9460"),
        ("--url", "http://127.0.0.1:99999", "has a port that is not 1-65535"),
        ("--url", "http://127.0.0.1:0", "has a port that is not 1-65535"),
        ("--url", "http://", "names no host"),
        ("--extender", "extender:8888", "is no http:// URL: pass e.g. http://extender:8888"),
        ("--url", "http://[::1:9460", "is no URL: Invalid IPv6 URL"),  # a traceback, these two
        ("--extender", "http://[fd00::7:9462/", "is no URL: Invalid IPv6 URL"),
    ],
)
def test_status_refuses_an_address_that_is_no_http_url_naming_it(
    flag: str, given: str, problem: str
) -> None:
    """A URL without its scheme failed with 'unknown url type: 127.0.0.1'; a port over 65535
    was read modulo 65536 (99999 connected to 34463) and reported that port refused."""
    result = CliRunner().invoke(app, ["status", flag, given])
    assert result.exit_code == 2, result.output
    assert result.output == f"baton status: {flag} {given!r} {problem}\n"


def test_status_through_a_cluster_it_cannot_read_says_why_in_one_line(tmp_path: Path) -> None:
    def status(kubeconfig: Path) -> list[str]:
        args = ["status", "--extender", "http://127.0.0.1:9", "--kubeconfig", str(kubeconfig)]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 1, result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)
        return result.output.splitlines()

    missing = tmp_path / "missing"
    assert status(missing) == [
        f"baton status: cannot find the agents through {missing}: "
        f"kubeconfig file '{missing}' does not exist"
    ]
    with FakeApiServer() as server:
        kubeconfig = server.kubeconfig_path(tmp_path)
        server.fail_next("list", "nodes", 403, message=FORBIDDEN)
        [line] = status(kubeconfig)
        assert line.endswith(f"answered 403: {FORBIDDEN}"), line
        server.stop()
        [line] = status(kubeconfig)
    assert "cannot reach the API server at http" in line and "refused" in line, line


def test_agents_are_found_in_the_namespace_baton_was_installed_in(tmp_path: Path) -> None:
    from commands.status.cluster import agent_addresses

    def agent_pod(namespace: str, ip: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "baton-agent-x", "namespace": namespace,
                "labels": {"app.kubernetes.io/name": "baton-agent"},
            },
            "spec": {"nodeName": "n1", "containers": [{"name": "agent", "image": "baton"}]},
            "status": {"phase": "Running", "podIP": ip},
        }  # fmt: skip

    node = {
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
        "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]},
    }  # fmt: skip
    with FakeApiServer() as server:
        kubeconfig = str(server.kubeconfig_path(tmp_path))
        for obj in (node, agent_pod("gpu-sharing", "10.1.0.7"), agent_pod("other", "10.9.9.9")):
            server.put_object(obj)
        assert agent_addresses(kubeconfig) == ({"n1": "10.0.0.1"}, set())  # none there
        assert agent_addresses(kubeconfig, "gpu-sharing") == ({"n1": "10.1.0.7"}, set())


def test_an_agent_pod_shutting_down_is_read_marked_and_a_running_one_preferred(
    tmp_path: Path,
) -> None:
    """As `kubectl baton status`: a node whose only agent pod is terminating (it serves until it
    stops) is read from it and marked so; where a new pod runs beside it, the new one is read
    (whichever the API lists last was read, the terminating one included, unmarked)."""
    from commands.status.cluster import agent_addresses

    def agent_pod(name: str, node: str, ip: str, leaving: bool) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "name": name, "namespace": "baton-system",
            "labels": {"app.kubernetes.io/name": "baton-agent"},
        }  # fmt: skip
        if leaving:
            meta["deletionTimestamp"] = "2024-05-01T10:00:00Z"
        return {
            "apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": node, "containers": [{"name": "agent", "image": "baton"}]},
            "status": {"phase": "Running", "podIP": ip},
        }  # fmt: skip

    with FakeApiServer() as server:
        kubeconfig = str(server.kubeconfig_path(tmp_path))
        for pod in (
            agent_pod("agent-a-new", "n1", "10.1.0.2", False),
            agent_pod("agent-b-old", "n1", "10.1.0.1", True),
            agent_pod("agent-c-old", "n2", "10.1.0.3", True),
        ):
            server.put_object(pod)
        addresses, terminating = agent_addresses(kubeconfig)
    assert addresses == {"n1": "10.1.0.2", "n2": "10.1.0.3"} and terminating == {"n2"}
    urls = {"n1": "http://10.1.0.2:9460", "n2": "http://10.1.0.3:9460"}
    inventory = {"nodes": [{"name": "n1", "gpus": []}, {"name": "n2", "gpus": []}]}
    doc = cluster_document(inventory, {"n1": AGENT, "n2": AGENT}, urls, terminating)
    assert [n["agent_terminating"] for n in doc["nodes"]] == [False, True]
    console = Console(record=True, width=300)
    console.print(gpu_rows_table(doc))
    text = console.export_text()
    assert text.count("agent pod terminating") == 1 and "(http://10.1.0.3:9460)" in text


@contextlib.contextmanager
def _answering(raw: bytes) -> Iterator[str]:
    """The URL of a server that answers one request with `raw` and closes."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with contextlib.suppress(OSError), listener.accept()[0] as conn:
            conn.recv(65536)
            conn.sendall(raw)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()
        thread.join(timeout=10)


def test_status_says_what_an_address_that_is_no_agents_http_answered(free_tcp_port: int) -> None:
    grpc_port = free_tcp_port
    with AgentRunner(debug_tcp_port=grpc_port) as agent:
        answers = {
            f"http://127.0.0.1:{grpc_port}": "did not answer in HTTP (it began '\\x00",
            f"{agent.http_url}/v1/status": f"{agent.http_url}/v1/status/v1/status answered "
            f"HTTP 404 Not Found: is {agent.http_url}/v1/status an agent's address?",
        }
        said = {url: CliRunner().invoke(app, ["status", "--url", url]) for url in answers}
    cut = b'HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{"gpus"'
    with _answering(cut) as url:
        answers[url] = f"the agent at {url} gave no whole HTTP answer (IncompleteRead("
        said[url] = CliRunner().invoke(app, ["status", "--url", url])
    for url, expected in answers.items():
        assert said[url].exit_code == 1, said[url].output
        assert said[url].output.startswith("baton status: ") and expected in said[url].output
        assert said[url].output.count("\n") == 1, said[url].output


def test_status_of_one_agent_shows_long_names_whole_at_80_columns_as_when_piped() -> None:
    """Piped (rich draws 80 columns), a tenant's id was cut to 'local/llama-…' in both tables."""
    name = "llama-70b-finetune-worker-0-of-16"
    with AgentRunner() as agent:
        tenant = TenantProcess(agent.socket, name, [GPU])
        try:
            assert tenant.request("acquire")["ok"]
            result = CliRunner().invoke(
                app, ["status", "--url", agent.http_url], env={"COLUMNS": "80"}
            )
        finally:
            tenant.close()
    assert result.exit_code == 0, result.output
    assert "…" not in result.output, result.output
    gpus, tenants = result.output.split("Tenants")
    assert f"local/{name}" in table_columns(gpus)[1], result.output  # the holder
    assert f"local/{name}" in table_columns(tenants)[0], result.output


@pytest.mark.parametrize("synced", [True, False])
@pytest.mark.parametrize("as_json", [False, True])
def test_status_of_an_extender_listing_no_node_says_so_and_exits_3(
    synced: bool, as_json: bool
) -> None:
    """An empty inventory printed an empty table (or no nodes), exit status 0 and no word,
    where `kubectl baton status` finding nothing to show says one line and exits 3."""
    body = json.dumps({"synced": synced, "nodes": []}).encode()
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
    with _answering(head.encode() + b"\r\nConnection: close\r\n\r\n" + body) as url:
        args = ["status", "--extender", url, *(["--json"] if as_json else [])]
        result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 3, result.output
    unsynced = "" if synced else " (it has not synced with the API server yet)"
    assert result.stderr.splitlines() == [
        f"baton status: the extender at {url} lists no node{unsynced}"
    ]
    if as_json:
        assert json.loads(result.stdout)["nodes"] == []
    else:
        assert "Baton GPUs" in result.stdout

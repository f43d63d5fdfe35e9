"""`kubectl baton jobs`: the coordinator's job turns through the API server's pod proxy. The
leader's /v1/status is the real coordinator's document (`coordinator.status.status_json` over an
arbiter whose job turns loopback agents prepared); the API server is the dict of paths."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from typer.testing import CliRunner

from baton.contract.names import ANNOTATION_COORDINATOR_LEADER_EPOCH, LABEL_COORDINATOR_LEADER
from commands.kubectl import cli
from commands.kubectl.api import Forbidden, NoAnswer
from commands.kubectl.jobs import COORDINATOR_SELECTOR, coordinator_status_path
from coordinator.status import status_json
from coordinator.turns import Arbiter
from tests.coordinator.loopback import LoopbackNode, leading, view_of
from tests.coordinator.test_members import until
from tests.kubectl.fake import DictApi

NS = "baton-system"
PODS = f"/api/v1/namespaces/{NS}/pods"
T = TypeVar("T")


def while_eval_waits(tmp: Path, read: Callable[[Arbiter, LoopbackNode], T]) -> T:
    """`read(arbiter, n1)` while team/rl holds its GPUs on n1 and n2 and ops/eval, one pod on
    n1, waits for its turn: loopback agents and a real arbiter, stopped after."""

    async def body() -> T:
        n1 = await LoopbackNode("n1", tmp / "n1", ("GPU-n1",)).start()
        n2 = await LoopbackNode("n2", tmp / "n2", ("GPU-n2",)).start()
        jobs = {
            "rl": [("team/rl-trainer", "n1", ""), ("team/rl-sampler", "n2", "")],
            "eval": [("ops/eval-a", "n1", "")],
        }
        arbiter = await leading(view_of([n1, n2], jobs))
        try:
            await arbiter.acquire("team", "rl", "", timeout=5)
            waiter = asyncio.ensure_future(arbiter.acquire("ops", "eval", "", timeout=5))
            await until(lambda: bool(arbiter.table.waiters), "ops/eval waiting")
            found = read(arbiter, n1)
            waiter.cancel()
            return found
        finally:
            await arbiter.close()
            await arbiter.links.close()
            await n1.stop()
            await n2.stop()

    return asyncio.run(asyncio.wait_for(body(), 30))


@pytest.fixture(scope="module")
def leader_status(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The leader's /v1/status: team/rl holds its GPUs on n1 and n2, ops/eval waits on n1's."""

    def read(arbiter: Arbiter, n1: LoopbackNode) -> dict[str, Any]:
        arbiter.settling.unsettled["n3"] = "its agent did not answer the leader's recovery"
        return status_json(arbiter, "coordinator-a", True, time.time())

    return while_eval_waits(tmp_path_factory.mktemp("coordinator"), read)


def replica(name: str, leads: bool, epoch: int = 1, phase: str = "Running") -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": "baton-coordinator"}
    annotations = {}
    if leads:
        labels[LABEL_COORDINATOR_LEADER] = "true"
        annotations[ANNOTATION_COORDINATOR_LEADER_EPOCH] = str(epoch)
    meta = {"name": name, "namespace": NS, "labels": labels, "annotations": annotations}
    return {"metadata": meta, "status": {"phase": phase}}


@pytest.fixture(autouse=True)
def _api(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's API client is the one its `run` names."""
    monkeypatch.setattr(cli.Settings, "make_api", cli.Settings.make_api)


def run(api: DictApi, *args: str) -> Any:
    cli.Settings.make_api = lambda kubeconfig, context: api
    return CliRunner().invoke(cli.app, ["jobs", *args], env={"COLUMNS": "120"})


def routes(status: Any, *pods: dict[str, Any]) -> dict[str, Any]:
    found = {PODS: {"items": list(pods)}}
    for pod in pods:
        found[coordinator_status_path(pod["metadata"]["name"], NS)] = status
    return found


def test_jobs_shows_who_holds_which_nodes_and_who_waits(leader_status: dict[str, Any]) -> None:
    api = DictApi(routes(leader_status, replica("coordinator-a", True), replica("b", False)))
    shown = run(api, "-o", "json")
    assert shown.exit_code == 0, shown.output
    document = json.loads(shown.output)
    assert document["coordinator"] == "coordinator-a" and document["epoch"] == 1
    rows = {row["job"]: row for row in document["jobs"]}
    assert rows["team/rl"]["state"] == "holding"
    assert rows["team/rl"]["nodes"] == ["n1", "n2"] and rows["team/rl"]["gpus"] == 2
    assert rows["ops/eval"]["state"] == "waiting" and rows["ops/eval"]["nodes"] == ["n1"]
    assert document["unsettled"] == {"n3": "its agent did not answer the leader's recovery"}
    assert (PODS, {"labelSelector": COORDINATOR_SELECTOR}) in api.asked
    table = run(api)
    assert table.exit_code == 0, table.output
    assert "team/rl" in table.output and "holding" in table.output and "n1, n2" in table.output
    assert "node n3: not heard by the leader yet" in table.output


def test_jobs_of_one_namespace(leader_status: dict[str, Any]) -> None:
    api = DictApi(routes(leader_status, replica("coordinator-a", True)))
    shown = run(api, "-n", "ops", "-o", "json")
    assert [row["job"] for row in json.loads(shown.output)["jobs"]] == ["ops/eval"]


def test_the_newest_epochs_leader_is_read_where_two_carry_the_label(
    leader_status: dict[str, Any],
) -> None:
    """A replica that lost the lease may still carry the label until it steps down."""
    old, new = replica("old", True, epoch=3), replica("new", True, epoch=4)
    api = DictApi(routes(leader_status, old, new))
    assert json.loads(run(api, "-o", "json").output)["coordinator"] == "new"


def test_no_coordinator_installed_exits_3_saying_so() -> None:
    shown = run(DictApi({PODS: {"items": []}}))
    assert shown.exit_code == cli.NO_AGENT_EXIT
    assert "no Baton coordinator pod" in shown.output and "coordinator.enabled" in shown.output


@pytest.mark.parametrize(
    ("pods", "status", "said"),
    [
        (
            [replica("a", False), replica("b", False)],
            {},
            "no coordinator replica leads now (a, b): an election is under way",
        ),
        (
            [replica("a", True, phase="Pending")],
            {},
            "no coordinator replica leads now (a)",
        ),
        ([replica("a", True)], {"leading": False}, "coordinator a does not lead any more"),
        ([replica("a", True)], ["not", "an", "object"], "coordinator a sent no JSON object"),
        (
            [replica("a", True)],
            NoAnswer("timed out", 10.0),
            "coordinator a: no answer within 10 s through the API server's pod proxy",
        ),
        ([replica("a", True)], Forbidden("cannot get pods/proxy in baton-system"), "pods/proxy"),
    ],
    ids=["no-leader", "leader-not-running", "stale-label", "no-json", "no-answer", "forbidden"],
)
def test_a_coordinator_that_cannot_be_read_is_one_line_and_exit_1(
    pods: list[dict[str, Any]], status: Any, said: str
) -> None:
    shown = run(DictApi(routes(status, *pods)))
    assert shown.exit_code == 1
    lines = shown.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kubectl baton: ") and said in lines[0]


def test_a_bad_namespace_is_refused_before_asking() -> None:
    api = DictApi({})
    shown = run(api, "-n", "Not_A_Name")
    assert shown.exit_code == 2 and "namespace 'Not_A_Name' is not a Kubernetes name" in (
        shown.output
    )
    assert not api.asked


def test_a_watch_goes_on_through_an_election(leader_status: dict[str, Any]) -> None:
    """Each refresh reads again: a reading without a leader, or whose leader does not answer
    (it failed, its label not moved yet), is said on stderr, the next one with a leader shows
    its jobs, and the exit status is the last reading's."""
    electing = routes({}, replica("a", False), replica("b", False))
    led = routes(leader_status, replica("a", True))
    failed = routes(NoAnswer("timed out", 10.0), replica("a", True))
    readings = iter([electing, led, failed])

    class Changing(DictApi):
        def get(self, path: str, **params: str) -> Any:
            if path == PODS:
                self.routes = next(readings)
            return super().get(path, **params)

    shown = run(Changing({}), "--watch", "--interval", "0.1", "--count", "3", "-o", "json")
    lines = shown.output.strip().splitlines()
    said = [line for line in lines if line.startswith("kubectl baton: ")]
    assert len(said) == 2, shown.output
    assert "no coordinator replica leads now" in said[0] and "no answer within 10 s" in said[1]
    (document,) = [json.loads(line) for line in lines if line.startswith("{")]
    assert document["coordinator"] == "a"
    assert shown.exit_code == 1

"""`kubectl baton why POD` for a pod of a job whose turns the cluster coordinator gives: such a
pod waits in the coordinator's queue, not in its node's. The agent's and the leader's
/v1/status are the real ones (loopback agents, a real arbiter); the API server is the dict of
paths."""

from __future__ import annotations

import time
from typing import Any

import pytest

from agent.server.status import status_json as agent_status_json
from baton.contract.names import NODE_POD_SELECTOR
from commands.kubectl.api import agent_status_path
from commands.kubectl.why import why
from coordinator.status import status_json
from coordinator.turns import Arbiter
from tests.coordinator.loopback import LoopbackNode
from tests.kubectl.fake import DictApi, agent_pod
from tests.kubectl.test_jobs import NS, PODS, replica, routes, while_eval_waits

AGENT = "baton-agent-n1"


@pytest.fixture(scope="module")
def statuses(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    """The leader's and n1's agent's /v1/status while team/rl holds its GPUs on n1 and n2 and
    ops/eval, one pod on n1, waits for its turn."""

    def read(arbiter: Arbiter, n1: LoopbackNode) -> tuple[dict[str, Any], dict[str, Any]]:
        now = time.time()
        return status_json(arbiter, "coordinator-a", True, now), agent_status_json(n1.service, now)

    return while_eval_waits(tmp_path_factory.mktemp("coordinator"), read)


def pod(namespace: str, name: str) -> dict[str, Any]:
    meta = {"name": name, "namespace": namespace, "uid": f"uid-{name}"}
    return {"metadata": meta, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}


class Selecting(DictApi):
    """The pods listed are those of the label selector asked."""

    def get(self, path: str, **params: str) -> Any:
        answer = super().get(path, **params)
        label, _, value = params.get("labelSelector", "").partition("=")
        if not label:
            return answer
        items = [p for p in answer["items"] if p["metadata"]["labels"].get(label) == value]
        return {"items": items}


def api_with(agent: dict[str, Any], leader: Any, *replicas: dict[str, Any]) -> DictApi:
    found = routes(leader, *replicas)
    label, _, value = NODE_POD_SELECTOR.partition("=")
    found[PODS]["items"].append(agent_pod("n1", AGENT))
    found[PODS]["items"][-1]["metadata"]["labels"] = {label: value}
    found[agent_status_path(AGENT, NS)] = agent
    for namespace, name in (("ops", "eval-a"), ("team", "rl-trainer")):
        found[f"/api/v1/namespaces/{namespace}/pods/{name}"] = pod(namespace, name)
    return Selecting(found)


def test_a_jobs_pod_waiting_for_its_turn_says_so_from_the_coordinator(
    statuses: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    """The agent knows ops/eval-a but has it in no queue: it said 'GPU-n1: not asking for a
    turn (holder: team/rl-trainer)' of a pod that waits for its job's turn."""
    leader, agent = statuses
    api = api_with(agent, leader, replica("coordinator-a", True))
    answer = why(api, "ops", "eval-a", NS)
    assert answer["stage"] == "turn"
    waits, held = answer["reasons"]
    assert waits.startswith("job ops/eval waits ") and waits.endswith(
        " s for its turn on n1, in the cluster coordinator's queue (kubectl baton jobs)"
    ), waits
    assert held == "GPU-n1: held by team/rl-trainer now"
    holder = why(api, "team", "rl-trainer", NS)["reasons"]
    assert len(holder) == 1 and holder[0].startswith("GPU-n1: holds the turn ("), holder


def test_a_coordinator_not_read_is_said_and_the_agents_view_kept(
    statuses: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    leader, agent = statuses
    electing = api_with(agent, leader, replica("a", False))
    said, held = why(electing, "ops", "eval-a", NS)["reasons"]
    assert said.startswith(
        "job ops/eval takes its turns through the cluster coordinator, not read: no coordinator"
        " replica leads now (a)"
    ), said
    assert held == "GPU-n1: held by team/rl-trainer now"
    alone = why(api_with(agent, leader), "ops", "eval-a", NS)["reasons"]  # no coordinator
    assert alone == ["GPU-n1: not asking for a turn (holder: team/rl-trainer)"]

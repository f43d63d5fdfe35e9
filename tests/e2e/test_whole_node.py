"""The whole node end to end: extender, device plugin and agent as `baton` processes.

What is real: `baton extender` over HTTP, `baton deviceplugin --fake-gpus` on its unix socket,
`baton agent --backend fake` in Kubernetes mode (it watches this node's pods on the API server),
each a subprocess; the fake API server (tests/harness/fakeapi.py) that all three reach with the
real `kubernetes` client; the kubelet stub (tests/harness/kubelet.py) the device plugin registers
with and serves GetPreferredAllocation/Allocate to; the example GRPO loop as each tenant, with
its simulated device memory that the agent parks and restores.

What is simulated, and how (see tests/e2e/cluster.py): kube-scheduler, as a replay of its
filter → prioritize → bind calls in its wire format; the container runtime, as a local process
in a private mount namespace holding exactly the Allocate response's mounts (the node's host
paths live under a temp root) and an env made of the pod spec's env plus exactly the Allocate
response's envs (plus HOSTNAME, PATH and PYTHONPATH, which the image and runtime would give).
The pod's cgroup: this machine runs no kubepods cgroups, so the runtime writes what the kernel
would show in /proc/<pid>/cgroup into a simulated proc tree that the agent reads through its
`--proc-root` flag (in a DaemonSet that flag points at the host's /proc). The agent therefore
maps each tenant's PID to its pod exactly as it does on a cluster. A second node has GPUs on
paper only, so that kube-scheduler has a choice and calls prioritize.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

from baton.contract import names
from tests.e2e.node import NODE, SPARE_NODE, STEPS, TENANTS, Node
from tests.e2e.processes import get_json, poll

TURN = re.compile(
    r"^(?P<tenant>\S+) step (?P<step>\d+) (?P<phase>generation|training): waited [\d.]+ ms, "
    r"held [\d.]+ ms on (?P<gpus>\S+) \(token (?P<token>[\d,]+)\)$",
    re.M,
)


def chosen_gpu(node: Node, pod: str) -> str:
    found = node.api.get_object("Pod", pod)
    assert found is not None
    return str(found["metadata"]["annotations"][names.ANNOTATION_ASSIGNED_GPUS])


def test_scheduler_calls_place_every_tenant_on_the_node_with_daemons(node: Node) -> None:
    for name, placement in node.placements.items():
        assert set(placement.passed) == {NODE, SPARE_NODE}, placement
        assert placement.scores[NODE] > placement.scores[SPARE_NODE], placement.scores
        assert placement.node == NODE
        pod = node.api.get_object("Pod", name)
        assert pod is not None and pod["spec"]["nodeName"] == NODE
        assert names.ANNOTATION_ALLOCATED_AT in pod["metadata"]["annotations"]
    gpus = {chosen_gpu(node, name) for name in TENANTS}
    assert gpus == {names.fake_gpu_uuid(1, NODE)}, "the only GPU of the node the tenants fit"


def test_allocate_hands_each_container_the_gpu_the_extender_chose(node: Node) -> None:
    for name, container in node.containers.items():
        gpu = chosen_gpu(node, name)
        assert {names.gpu_of_device_id(d) for d in container.devices} == {gpu}
        found = node.api.get_object("Pod", name)
        assert found is not None
        recorded = json.loads(found["metadata"]["annotations"][names.ANNOTATION_CONTAINER_GPUS])
        assert recorded == {"trainer": [gpu]}, "the kubelet's allocation, read back from it"
        assert container.env[names.ENV_GPUS] == gpu
        assert container.env[names.ENV_NVIDIA_VISIBLE_DEVICES] == gpu
        assert container.env[names.ENV_AGENT_SOCKET] == names.AGENT_SOCKET
        targets = [target for _host, target, _ro in container.mounts]
        assert names.AGENT_SOCKET_DIR in targets


def test_tenants_take_turns_on_that_gpu_and_their_memory_survives_parking(node: Node) -> None:
    gpu = chosen_gpu(node, TENANTS[0])
    tokens: dict[str, list[int]] = defaultdict(list)
    for name, (code, out, err) in node.outputs.items():
        assert code == 0, f"{name} failed:\n{err}"
        turns = list(TURN.finditer(out))
        assert len(turns) == 2 * STEPS, out
        assert {t["gpus"] for t in turns} == {gpu}
        tokens[name] = [int(t["token"]) for t in turns]
        assert f"{name} memory verified after {2 * STEPS - 1} turns" in out
    every = sorted(t for seq in tokens.values() for t in seq)
    assert every == list(range(1, len(every) + 1)), "one grant at a time, each a new token"
    for name, seq in tokens.items():
        assert seq == sorted(seq)
        gaps = sum(1 for a, b in itertools.pairwise(seq) if b != a + 1)
        assert gaps > 0, f"{name} took all its turns back to back: nobody took turns"
    moves = {
        (s.labels["direction"], s.name): s.value
        for family in text_string_to_metric_families(node.agent_metrics)
        for s in family.samples
        if s.name in ("baton_moves_total", "baton_moved_bytes_total")
    }
    assert moves[("park", "baton_moves_total")] > 0 and moves[("restore", "baton_moves_total")] > 0
    assert moves[("park", "baton_moved_bytes_total")] >= 400 * names.MIB


def test_baton_status_and_the_inventory_tell_the_same_story(node: Node) -> None:
    inventory = {n["name"]: n for n in node.inventory["nodes"]}
    status = {n["name"]: n for n in node.status_json["nodes"]}
    assert set(status) == set(inventory) == {NODE, SPARE_NODE}
    assert status[SPARE_NODE]["error"], "node-b runs no agent; status must say so"
    ours = status[NODE]
    assert ours["error"] is None
    assert ours["agent"] == f"http://127.0.0.1:{node.agent_port}"
    assert ours["host_memory_budget_bytes"] == ours["annotated_budget_mib"] * names.MIB
    for gpu in inventory[NODE]["gpus"]:
        row = next(g for g in ours["gpus"] if g["uuid"] == gpu["uuid"])
        pods = sorted(t["pod"] for t in gpu["tenants"])
        assert sorted(row["pods"]) == pods
        assert sorted(row["tenants"]) == pods, "agent tenants are the pods the extender placed"
        assert set(row["resident"]) | set(row["parked"]) <= set(row["tenants"])
        assert row["holder"] is None or row["holder"] in row["tenants"]
    busy = next(g for g in ours["gpus"] if g["pods"])
    assert busy["parked"], "read while three tenants share a GPU that holds two"
    assert 0 < busy["duty_last_minute"] <= 1
    seen = node.agent_status["gpus"][busy["uuid"]]
    assert seen["holder"] in busy["tenants"]
    table = node.status_table
    assert NODE in table and SPARE_NODE in table and busy["uuid"] in table
    assert "cannot reach the agent" in table and "MiB (" in table, table


def test_finished_pods_leave_both_the_agent_and_the_inventory(node: Node) -> None:
    def settled() -> bool | None:
        agent = get_json(f"{node.agent_url}/v1/status")
        inventory = get_json(f"{node.extender_url}/v1/inventory")
        placed = [t for n in inventory["nodes"] for g in n["gpus"] for t in g["tenants"]]
        return True if not agent["tenants"] and not placed else None

    poll("agent and extender forgetting the finished pods", settled, 15)

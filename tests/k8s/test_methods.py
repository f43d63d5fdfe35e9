"""Two parking methods on the real node: a pod that offloads itself (`baton.dev/parking: app`)
and one the node parks by its default (fake) share one GPU too small for both, take turns that
each park the other by its own method, verify their data, and /v1/status names each method."""

from __future__ import annotations

import json
from typing import Any

from baton.contract import names
from tests.k8s.cluster import AGENT_URL, Cluster, get_text, metric, wait_for
from tests.k8s.pods import tenant_pod

MIB_EACH = 45000
"""Each tenant's declared GPU memory: two do not fit on one 81920 MiB fake GPU."""
APP_TURNS = 12
APP_SCRIPT = r"""
import json, os, random, threading, time
from agent.client import Baton
declared = int(os.environ["APP_GPU_MEMORY_MIB"]) << 20
expected = random.Random(1).randbytes(4 << 20)
held = {"device": bytearray(expected), "host": None}
printing = threading.Lock()  # the callbacks run on the client's thread, the turns on this one
def say(**event):
    with printing:
        print(json.dumps(event), flush=True)
def on_park(gpu):
    held["host"], held["device"] = bytes(held["device"]), None
    say(event="parked", gpu=gpu)
    return declared
def on_restore(gpu):
    held["device"], held["host"] = bytearray(held["host"]), None
    say(event="restored", gpu=gpu)
    return declared
baton = Baton(name="selfish", on_park=on_park, on_restore=on_restore)
for i in range(int(os.environ["APP_TURNS"])):
    with baton.turn(timeout=60):
        if held["device"] != expected:
            raise SystemExit("device bytes differ after restore")
        time.sleep(0.1)
    say(event="turn", i=i)
    time.sleep(0.1)
with printing:
    print("app memory verified", flush=True)
baton.close()
"""
"""Stands in for a framework's offload: 4 MiB really copied, its declared footprint reported."""


def app_pod(name: str, namespace: str) -> dict[str, Any]:
    """A tenant pod that asks to park itself and offers park/restore callbacks."""
    pod = tenant_pod(name, namespace, memory_mib=MIB_EACH, memory_limit=None)
    pod["metadata"]["annotations"] = {names.ANNOTATION_PARKING: "app"}
    container = pod["spec"]["containers"][0]
    container["command"] = ["python", "-c", APP_SCRIPT]
    container["env"] += [
        {"name": "APP_GPU_MEMORY_MIB", "value": str(MIB_EACH)},
        {"name": "APP_TURNS", "value": str(APP_TURNS)},
    ]
    return pod


def test_a_self_offloading_pod_and_a_node_parked_pod_share_one_gpu(
    cluster: Cluster, namespace: str
) -> None:
    moves_before = {
        (m, d): metric(
            get_text(f"{AGENT_URL}/metrics"), "baton_moves_total", backend=m, direction=d
        )
        for m in ("fake", "app")
        for d in ("park", "restore")
    }
    plain = tenant_pod("plain", namespace, steps=12, memory_mib=MIB_EACH, memory_limit=None)
    cluster.apply(plain, app_pod("selfish", namespace))
    tenants = {f"{namespace}/plain": "fake", f"{namespace}/selfish": "app"}

    def both_named() -> dict[str, str] | None:
        status = json.loads(get_text(f"{AGENT_URL}/v1/status"))
        found = status.get("residency", {}).get("tenants", {})
        methods = {t: found[t].get("method") for t in tenants if t in found}
        return methods if methods == tenants else None

    assert wait_for("/v1/status to name both tenants' methods", both_named, 120) == tenants
    cluster.wait_succeeded(namespace, "plain", "selfish", timeout=180)
    gpus = {cluster.pod(namespace, n)["metadata"]["annotations"][names.ANNOTATION_ASSIGNED_GPUS]
            for n in ("plain", "selfish")}  # fmt: skip
    assert len(gpus) == 1, f"the two tenants were not put on one GPU: {gpus}"
    plain_log, app_log = cluster.logs(namespace, "plain"), cluster.logs(namespace, "selfish")
    assert "memory verified" in plain_log, plain_log
    assert "app memory verified" in app_log, app_log
    events = [json.loads(line) for line in app_log.splitlines() if line.startswith("{")]
    assert any(e["event"] == "parked" for e in events), app_log
    assert any(e["event"] == "restored" for e in events), app_log
    text = get_text(f"{AGENT_URL}/metrics")
    for (method, direction), before in moves_before.items():
        now = metric(text, "baton_moves_total", backend=method, direction=direction)
        assert now > before, f"no {direction} by {method}"

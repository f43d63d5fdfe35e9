"""The API server goes away under the agent's pod watch, or between a bind's two writes.

(Outages at the start of the extender's bind and during the device plugin's Allocate are
`tests/extender/test_bind.py` and `tests/deviceplugin/test_allocate.py`.)
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

from agent.client import Baton
from baton.contract.names import ANNOTATION_ASSIGNED_GPUS
from extender.bind import Binder
from extender.kubeapi import KubePodApi
from extender.wire import BindingArgs
from tests.agent.node.test_podwatch import UID, pod
from tests.agent.parking.nodeharness import LogWatch
from tests.extender.binding import bind_once
from tests.extender.builders import node
from tests.extender.builders import pod as tenant
from tests.harness.agent import AgentRunner, short_tmpdir
from tests.harness.fakeapi import FakeApiServer

from .figures import record

pytestmark = pytest.mark.timeout(60)
OTHER_UID = "31111111-2222-4333-8444-555555555555"
NEW_UID = "41111111-2222-4333-8444-555555555555"


def test_the_agent_rides_out_an_api_outage_and_catches_up_when_it_returns(tmp_path: Path):
    """Promised: while the API server is down the agent says so in its log, keeps its pod
    tenants and the holder's turn; once it is back, a pod deleted meanwhile is gone and a pod
    added meanwhile is a tenant."""
    proc = tmp_path / "proc" / str(os.getpid())
    proc.mkdir(parents=True)
    proc.joinpath("cgroup").write_text(f"0::/kubepods/burstable/pod{UID}/abc\n")
    watch = LogWatch("watch of node node-1's pods: ")
    logging.getLogger("agent.node.podwatch").addHandler(watch)
    with FakeApiServer() as api:
        api.put_object(pod("trainer", UID, "node-1", "GPU-a"))
        api.put_object(pod("other", OTHER_UID, "node-1", "GPU-a"))
        runner = AgentRunner(
            short_tmpdir(),
            node_name="node-1",
            kubeconfig=str(api.kubeconfig_path(tmp_path)),
            proc_root=str(tmp_path / "proc"),
        ).start()
        baton = Baton(runner.socket, name="in-a-pod", connect_timeout=5)
        try:
            runner.wait_event(lambda e: e.kind == "tenant_joined" and e.tenant_id == "team/other")
            lease = baton.acquire(timeout=10)
            api.stop()
            down = time.monotonic()
            assert watch.seen.wait(10), "the agent did not report the lost pod watch"
            status = runner.status()
            assert status["gpus"]["GPU-a"]["holder"] == "team/trainer"
            assert set(status["tenants"]) == {"team/trainer", "team/other"}
            mark = runner.mark()
            api.remove_object("Pod", "other", "team")
            api.put_object(pod("newcomer", NEW_UID, "node-1", "GPU-a"))
            api.start()
            back = time.monotonic()
            runner.wait_event(
                lambda e: e.kind == "tenant_gone" and e.tenant_id == "team/other", 20, mark
            )
            runner.wait_event(
                lambda e: e.kind == "tenant_joined" and e.tenant_id == "team/newcomer", 20, mark
            )
            caught_up_s = time.monotonic() - back
            assert runner.status()["gpus"]["GPU-a"]["holder"] == "team/trainer"
            assert baton.lease is not None and baton.lease.lease_id == lease.lease_id
            baton.yield_()
        finally:
            logging.getLogger("agent.node.podwatch").removeHandler(watch)
            baton.close()
            runner.stop()
    figures = {
        "outages": 1,
        "down_s": round(back - down, 3),
        "caught_up_s": round(caught_up_s, 3),
        "warnings": len(watch.messages),
        "held_turn_kept": 1,
    }
    record("faults", "API server down under the agent's pod watch", figures)


def test_a_bind_cut_off_at_its_binding_leaves_the_pod_untouched_and_binds_once_the_api_is_back(
    fake_api, kube_cache, api_client
):
    """Promised: the assignment travels in the Binding itself, so when the API server fails it
    bind answers the error, nothing is assumed, the pod carries no lone annotation, no GPU
    counts it, and the same bind succeeds when the server is back."""
    fake_api.put_object(node("gpu-1", gpus=1, slots=1))
    p = fake_api.put_object(tenant("trainer", memory=1000))
    assert kube_cache.wait_for(lambda s: s.node("gpu-1") is not None, 10)
    binder = Binder(kube_cache, KubePodApi(api_client), time.time_ns)
    args = BindingArgs("trainer", "default", p["metadata"]["uid"], "gpu-1")
    fake_api.fail_next("create", "pods/binding", 503, message="the API server is shutting down")
    error = bind_once(binder, args)
    attempts, failed = 1, int(bool(error))
    assert "API server answered 503" in error
    untouched = fake_api.get_object("Pod", "trainer")
    assert untouched is not None
    assert ANNOTATION_ASSIGNED_GPUS not in (untouched["metadata"].get("annotations") or {})
    assert kube_cache.state.assumed() == {}
    assert all(not g.tenants for g in kube_cache.state.node("gpu-1").gpus)
    assumed_after_failure = len(kube_cache.state.assumed())
    assert bind_once(binder, args) == ""
    attempts += 1
    bound = fake_api.get_object("Pod", "trainer")
    assert bound is not None and bound["spec"]["nodeName"] == "gpu-1"
    assert bound["metadata"]["annotations"][ANNOTATION_ASSIGNED_GPUS] == "GPU-gpu-1-0"
    figures = {"binds": attempts, "binds_failed": failed}
    figures |= {
        "assumed_after_failure": assumed_after_failure,
        "bound": int(bound["spec"]["nodeName"] == "gpu-1"),
    }
    record("faults", "API server failed at the Binding", figures)

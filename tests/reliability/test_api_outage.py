"""The API server goes away under the agent's pod watch, and comes back.

(Outages during the extender's bind and the device plugin's Allocate are
`tests/extender/test_bind.py` and `tests/deviceplugin/test_allocate.py`.)
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from agent.client import Baton
from tests.agent.test_podwatch import UID, pod
from tests.harness.agent import AgentRunner, short_tmpdir
from tests.harness.fakeapi import FakeApiServer
from tests.parking.nodeharness import LogWatch

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
    watch = LogWatch("pod watch failed")
    logging.getLogger("agent.podwatch").addHandler(watch)
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
            assert watch.seen.wait(10), "the agent did not report the lost pod watch"
            status = runner.status()
            assert status["gpus"]["GPU-a"]["holder"] == "team/trainer"
            assert set(status["tenants"]) == {"team/trainer", "team/other"}
            mark = runner.mark()
            api.remove_object("Pod", "other", "team")
            api.put_object(pod("newcomer", NEW_UID, "node-1", "GPU-a"))
            api.start()
            runner.wait_event(
                lambda e: e.kind == "tenant_gone" and e.tenant_id == "team/other", 20, mark
            )
            runner.wait_event(
                lambda e: e.kind == "tenant_joined" and e.tenant_id == "team/newcomer", 20, mark
            )
            assert runner.status()["gpus"]["GPU-a"]["holder"] == "team/trainer"
            assert baton.lease is not None and baton.lease.lease_id == lease.lease_id
            baton.yield_()
        finally:
            logging.getLogger("agent.podwatch").removeHandler(watch)
            baton.close()
            runner.stop()
    record(
        "faults", "API server down under the agent's pod watch", {"said": watch.messages[0][:60]}
    )

"""The agent over its real unix socket with real tenant processes using the client library."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from agent.core.events import Event
from tests.agent.conftest import TenantFactory
from tests.harness.agent import AgentRunner


def granted_to(tenant: str) -> Callable[[Event], bool]:
    return lambda e: e.kind == "granted" and e.tenant_id == f"local/{tenant}"


def test_turns_alternate_between_two_processes(agent: AgentRunner, tenants: TenantFactory) -> None:
    a, b = tenants("a"), tenants("b")
    holders, tokens = [], []
    first = a.request("acquire")
    holders.append("a")
    tokens.append(first["tokens"]["GPU-0"])
    waiting, holding = b, a
    for _ in range(6):
        mark = agent.mark()
        waiting.send("acquire")
        agent.wait_event(lambda e: e.kind == "queued", since=mark)
        assert holding.request("yield") == {"ok": True}
        granted = waiting.reply()
        assert granted["ok"], granted
        holders.append(waiting.name)
        tokens.append(granted["tokens"]["GPU-0"])
        waiting, holding = holding, waiting
    assert holders == ["a", "b"] * 3 + ["a"]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


def test_sigkill_of_holder_frees_gpu_within_a_second(
    agent: AgentRunner, tenants: TenantFactory
) -> None:
    a, b = tenants("a"), tenants("b")
    assert a.request("acquire")["ok"]
    mark = agent.mark()
    b.send("acquire")
    agent.wait_event(lambda e: e.kind == "queued" and e.tenant_id == "local/b", since=mark)
    killed = time.monotonic()
    a.kill()
    agent.wait_event(granted_to("b"), timeout=5, since=mark)
    assert time.monotonic() - killed < 1.0
    assert b.reply()["ok"]
    gone = agent.wait_event(lambda e: e.kind == "tenant_gone" and e.tenant_id == "local/a")
    assert "session ended" in gone.detail
    status = agent.status()
    assert status["gpus"]["GPU-0"]["holder"] == "local/b"
    assert "local/a" not in status["tenants"]


def test_tenant_cannot_yield_or_inspect_another_tenants_lease(
    agent: AgentRunner, tenants: TenantFactory
) -> None:
    a, b = tenants("a"), tenants("b")
    lease_id = a.request("acquire")["lease_id"]
    for method in ("Yield", "GetLease"):
        refused = b.request("rpc", method=method, lease_id=lease_id)
        assert refused["code"] == "PERMISSION_DENIED"
        assert "local/a" in refused["message"]
    assert agent.status()["gpus"]["GPU-0"]["lease_id"] == lease_id


def test_errors_a_user_can_act_on(agent: AgentRunner, tenants: TenantFactory) -> None:
    a, b = tenants("a"), tenants("b")
    wrong = a.request("acquire", gpus=["GPU-9"])
    assert wrong["error"] == "InvalidRequest" and "GPU-0" in wrong["message"]
    assert b.request("rpc", method="Yield")["code"] == "FAILED_PRECONDITION"
    assert b.request("rpc", method="Yield", lease_id="no-such")["code"] == "NOT_FOUND"
    assert a.request("acquire")["ok"]
    late = b.request("acquire", timeout=0.2)
    assert late["error"] == "AcquireTimeout"
    assert agent.status()["gpus"]["GPU-0"]["queue"] == []
    raw = b.request("rpc", method="Acquire", timeout_ms=100)
    assert raw["code"] == "DEADLINE_EXCEEDED" and "left the queue" in raw["message"]
    assert agent.status()["gpus"]["GPU-0"]["queue"] == []


def _metric(text: str, name: str, gpu: str | None = None) -> float:
    label = f'{{gpu="{gpu}"}}' if gpu else ""
    match = re.search(rf"^{re.escape(name + label)} (\S+)$", text, re.M)
    assert match, f"{name}{label} not in /metrics"
    return float(match.group(1))


def test_metrics_and_status_agree_with_what_happened(
    agent: AgentRunner, tenants: TenantFactory
) -> None:
    a, b = tenants("a"), tenants("b")
    for _ in range(3):
        assert a.request("acquire")["ok"]
        assert a.request("yield")["ok"]
    assert a.request("acquire")["ok"]
    mark = agent.mark()
    b.send("acquire")
    agent.wait_event(lambda e: e.kind == "queued", since=mark)

    code, text = agent.http("/metrics")
    assert code == 200
    assert _metric(text, "baton_grants_total", "GPU-0") == 4
    assert _metric(text, "baton_queue_depth", "GPU-0") == 1
    assert _metric(text, "baton_active_tenants") == 2
    assert _metric(text, "baton_hold_seconds_count") == 3
    assert _metric(text, "baton_wait_seconds_count") == 4
    assert _metric(text, "baton_revocations_total") == 0
    assert _metric(text, "baton_gpu_busy_seconds_total", "GPU-0") > 0

    status = agent.status()["gpus"]["GPU-0"]
    assert status["holder"] == "local/a" and status["fencing_token"] == 4
    assert [q["tenant_id"] for q in status["queue"]] == ["local/b"]
    assert status["tenants"] == ["local/a", "local/b"]
    assert agent.http("/healthz")[0] == 200 and agent.http("/readyz")[0] == 200
    assert agent.http("/nope")[0] == 404


def test_restart_keeps_the_holders_turn(workdir: str) -> None:
    from tests.harness.agent import TenantProcess

    first = AgentRunner(workdir, reconnect_grace=30).start()
    a = TenantProcess(first.socket, "a", ["GPU-0"])
    b = None
    try:
        lease = a.request("acquire")
        first.stop()
        second = AgentRunner(workdir, reconnect_grace=30).start()
        try:
            second.wait_event(lambda e: e.kind == "connected" and e.tenant_id == "local/a")
            status = second.status()["gpus"]["GPU-0"]
            assert status["holder"] == "local/a" and status["lease_id"] == lease["lease_id"]
            b = TenantProcess(second.socket, "b", ["GPU-0"])
            mark = second.mark()
            b.send("acquire")
            second.wait_event(lambda e: e.kind == "queued", since=mark)
            assert a.request("yield")["ok"]  # the reconnected client still knows its lease
            granted = b.reply()
            assert granted["tokens"]["GPU-0"] == lease["tokens"]["GPU-0"] + 1
        finally:
            if b is not None:
                b.close()
            a.close()
            second.stop()
    finally:
        a.close()


def test_holder_that_does_not_come_back_loses_its_turn_after_the_grace(workdir: str) -> None:
    from tests.harness.agent import TenantProcess

    first = AgentRunner(workdir).start()
    a = TenantProcess(first.socket, "a", ["GPU-0"])
    lease = a.request("acquire")
    first.stop()
    a.kill()  # dies while the agent is down
    second = AgentRunner(workdir, reconnect_grace=1.5).start()
    assert second.status()["gpus"]["GPU-0"]["holder"] == "local/a"
    b = TenantProcess(second.socket, "b", ["GPU-0"])
    try:
        gone = second.wait_event(lambda e: e.kind == "tenant_gone" and e.tenant_id == "local/a")
        assert "did not reconnect" in gone.detail
        granted = b.request("acquire")
        assert granted["tokens"]["GPU-0"] == lease["tokens"]["GPU-0"] + 1
    finally:
        b.close()
        second.stop()


def test_metrics_have_every_gpus_series_before_any_tenant_names_it(workdir: str) -> None:
    from agent.client import Baton
    from agent.parking.setup import ParkingOptions
    from baton.contract.names import fake_gpu_uuid

    parking = ParkingOptions(backend="fake", fake_gpus="2x100", fake_dir=f"{workdir}/gpus")
    with AgentRunner(workdir, parking=parking) as agent:
        idle, named = fake_gpu_uuid(0), fake_gpu_uuid(1)
        fresh = agent.http("/metrics")[1]
        with Baton(agent.socket, [named], name="trainer") as baton:
            baton.acquire()
            baton.yield_()
            later = agent.http("/metrics")[1]
    per_gpu = ("baton_grants_total", "baton_queue_depth", "baton_gpu_tenants")
    for name in (*per_gpu, "baton_gpu_busy_seconds_total"):
        assert [_metric(fresh, name, gpu) for gpu in (idle, named)] == [0, 0], name
        assert _metric(later, name, idle) == 0, name
    assert [_metric(later, name, named) for name in per_gpu] == [1, 0, 1]
    assert _metric(later, "baton_gpu_busy_seconds_total", named) > 0

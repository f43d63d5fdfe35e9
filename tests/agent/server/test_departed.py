"""A tenant gone from the node is folded, `--forget-departed-after` seconds later, into its
namespace's `<namespace>/(departed)`: its series leave /metrics, while /v1/status and the state
file keep its time; a tenant that comes back under its id keeps its own rows."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.client import Baton
from agent.core.errors import InvalidRegistration
from agent.core.leases import LeaseTable
from agent.core.residency import NullPreparer
from agent.node.state import PersistedState, StateStore
from agent.node.tenants import POD, Tenant, TenantRegistry
from agent.server.accounting import Accounting, AccountingCollector
from agent.server.service import LeaseService
from commands.localnode.procs import wait_for
from tests.harness.agent import AgentRunner

GPU = "GPU-0"
HOUR = 3600.0


def _rows(acct: Accounting) -> dict[str, dict]:
    return {
        "gpu_seconds": dict(acct.gpu_seconds),
        "parked_byte_seconds": dict(acct.parked_byte_seconds),
        "by_gpu": dict(acct.by_gpu),
    }


def test_a_tenant_gone_for_the_retention_is_folded_into_its_namespace_per_tier_and_gpu() -> None:
    acct = Accounting()
    acct.held("ml/a", 1, (GPU, "GPU-1"), 2.0)
    acct.held("ml/b", 1, (GPU,), 3.0)
    acct.held("ml/c", 0, (GPU,), 5.0)
    acct.held("ops/d", 1, (GPU,), 7.0)
    acct.parked(10.0, {}, {})
    acct.parked(11.0, {"ml/a": 100}, {"ml/a": 1})
    acct.parked(12.0, {}, {})
    for tenant in ("ml/a", "ml/b", "ml/c"):
        acct.left(tenant, 100.0)
    acct.left("ops/d", 200.0)
    assert not acct.fold(100.0 + HOUR - 1, HOUR)  # not gone long enough yet
    assert acct.fold(100.0 + HOUR, HOUR)
    assert _rows(acct) == {
        "gpu_seconds": {
            ("ml/(departed)", "ml", 1): 7.0,
            ("ml/(departed)", "ml", 0): 5.0,
            ("ops/d", "ops", 1): 7.0,
        },
        "parked_byte_seconds": {("ml/(departed)", "ml", 1): 100.0},
        "by_gpu": {
            (GPU, "ml/(departed)"): 10.0,
            ("GPU-1", "ml/(departed)"): 2.0,
            (GPU, "ops/d"): 7.0,
        },
    }
    assert acct.departed == {"ops/d": 200.0}
    assert acct.by_namespace() == {"ml": 12.0, "ops": 7.0}, "the namespace's time is all kept"
    acct.held("ml/e", 1, (GPU,), 1.0)
    acct.left("ml/e", 300.0)
    assert acct.fold(300.0 + HOUR, HOUR)
    assert acct.gpu_seconds[("ml/(departed)", "ml", 1)] == 8.0, "a later one adds to the row"
    assert acct.gpu_seconds[("ops/(departed)", "ops", 1)] == 7.0


def test_zero_never_folds_and_a_tenant_back_keeps_its_rows() -> None:
    acct = Accounting()
    acct.held("ml/a", 0, (GPU,), 2.0)
    acct.left("ml/a", 0.0)
    kept = _rows(acct)
    assert not acct.fold(1e9, 0.0)
    assert acct.returned("ml/a")
    assert not acct.fold(1e9, HOUR)
    assert _rows(acct) == kept


def test_a_tenant_with_memory_still_parked_is_folded_once_it_has_none() -> None:
    acct = Accounting()
    acct.parked(0.0, {}, {})
    acct.parked(1.0, {"ml/a": 10}, {})
    acct.left("ml/a", 1.0)
    assert not acct.fold(1.0 + HOUR, HOUR), "its row would grow again at the next reading"
    acct.parked(2.0 + HOUR, {}, {})
    assert acct.fold(2.0 + HOUR, HOUR)
    parked_since_1 = 10.0 * (2.0 + HOUR - 1.0)
    assert acct.parked_byte_seconds == {("ml/(departed)", "ml", 0): parked_since_1}


def test_departure_times_round_trip_through_the_state_files_json() -> None:
    acct = Accounting()
    acct.held("ml/a", 2, (GPU,), 4.0)
    acct.left("ml/a", 123.5)
    again = Accounting()
    again.load(json.loads(json.dumps(acct.to_json())))
    assert again.departed == {"ml/a": 123.5}
    assert again.fold(123.5 + HOUR, HOUR)
    assert again.gpu_seconds == {("ml/(departed)", "ml", 2): 4.0}


def test_the_collector_exports_no_pseudo_tenant() -> None:
    acct = Accounting()
    for tenant in ("ml/a", "ml/b"):
        acct.held(tenant, 0, (GPU,), 1.0)
    acct.parked(0.0, {}, {})
    acct.parked(1.0, {"ml/a": 5, "ml/b": 5}, {})
    acct.left("ml/a", 0.0)
    acct.parked(2.0, {}, {})
    assert acct.fold(HOUR, HOUR)
    families = list(AccountingCollector(acct, lambda: None).collect())
    exported = {(f.name, s.labels["tenant"]) for f in families for s in f.samples}
    assert exported == {
        ("baton_tenant_gpu_seconds", "ml/b"),
        ("baton_tenant_parked_byte_seconds", "ml/b"),
    }


def test_no_tenant_registers_under_the_pseudo_tenants_name() -> None:
    with pytest.raises(InvalidRegistration, match=r"\(departed\) names the accounting's"):
        TenantRegistry().register_local(pid=1, uid=0, name="(departed)", gpus=[GPU])


def _pod(name: str) -> Tenant:
    return Tenant(f"default/{name}", name, (GPU,), source=POD)


def _service(path: Path, clock: Callable[[], float]) -> LeaseService:
    return LeaseService(
        table=LeaseTable(clock=time.time),
        preparer=lambda host: NullPreparer(),
        clock=clock,
        store=StateStore(path),
        forget_departed_after=HOUR,
    )


def test_a_pod_that_left_is_folded_after_the_retention_even_across_a_restart(
    tmp_path: Path,
) -> None:
    skew = [0.0]

    def clock() -> float:
        return time.time() + skew[0]

    async def run() -> float:
        agent = _service(tmp_path, clock)
        agent.upsert_pod(_pod("a"))
        held = await agent.acquire(_pod("a"), [GPU], timeout=5)
        agent.yield_(_pod("a"), held.lease.lease_id)
        agent.pod_gone("default/a")
        left_at = agent.metrics.accounting.departed["default/a"]
        await agent.close()
        again = _service(tmp_path, clock)
        again.load()
        acct = again.metrics.accounting
        assert acct.departed == {"default/a": left_at}, "when it left survives the restart"
        again.account()
        [[tenant, _, _, seconds]] = acct.to_json()["gpu_seconds"]
        assert tenant == "default/a"
        skew[0] = HOUR
        again.account()  # as a scrape or /v1/status does
        assert acct.to_json()["gpu_seconds"] == [["default/(departed)", "default", 0, seconds]]
        await again.close()
        return float(seconds)

    seconds = asyncio.run(asyncio.wait_for(run(), 10))
    saved = StateStore(tmp_path).load().accounting  # what the closing save wrote
    assert saved["gpu_seconds"] == [["default/(departed)", "default", 0, seconds]]
    assert saved["gpu_seconds_by_gpu"] == [[GPU, "default/(departed)", seconds]]
    assert saved["departed"] == []


def test_a_pod_recreated_under_its_name_keeps_its_own_rows(tmp_path: Path) -> None:
    skew = [0.0]

    async def run() -> dict[str, dict]:
        agent = _service(tmp_path, lambda: time.time() + skew[0])
        agent.upsert_pod(_pod("a"))
        agent.metrics.accounting.held("default/a", 0, (GPU,), 2.0)
        agent.pod_gone("default/a")
        agent.upsert_pod(_pod("a"))  # the StatefulSet made it again
        await agent.forgotten("default/a")  # it joins once the pod that left is forgotten
        skew[0] = 2 * HOUR
        agent.account()
        await agent.close()
        return _rows(agent.metrics.accounting)

    rows = asyncio.run(asyncio.wait_for(run(), 10))
    assert rows["gpu_seconds"] == {("default/a", "default", 0): 2.0}


def test_totals_of_a_tenant_a_restart_does_not_bring_back_count_as_departed(
    tmp_path: Path,
) -> None:
    """A state from a crash before the departure was saved, or from an agent that kept no
    departure times: those tenants' rows are forgotten in time too."""
    store = StateStore(tmp_path)
    old = {"gpu_seconds": [["default/old", "default", 0, 5.0]]}
    store.save_soon(PersistedState(tenants=[_pod("kept")], accounting=old))
    store.flush()
    store.close()

    async def run() -> dict[str, float]:
        agent = _service(tmp_path, lambda: 500.0)
        agent.load()
        departed = dict(agent.metrics.accounting.departed)
        await agent.close()
        return departed

    assert asyncio.run(asyncio.wait_for(run(), 10)) == {"default/old": 500.0}


def test_a_departed_tenants_series_leave_metrics_and_status_keeps_its_time(workdir: str) -> None:
    agent = AgentRunner(workdir, forget_departed_after=0.05).start()
    try:
        client = Baton(agent.socket, [GPU], name="a")
        try:
            client.acquire()
            client.yield_()
            assert 'tenant="local/a"' in agent.http("/metrics")[1]
        finally:
            client.close()
        agent.wait_event(lambda e: e.kind == "tenant_gone" and e.tenant_id == "local/a")

        def series_gone() -> str | None:
            metrics = agent.http("/metrics")[1]
            return None if 'tenant="local/a"' in metrics else metrics

        metrics = wait_for("local/a's series to leave /metrics", series_gone, 10, every=0.02)
        assert "(departed)" not in metrics
        assert "\nbaton_tenant_gpu_seconds_total{" not in metrics, "no series left at all"
        acct = agent.status()["accounting"]
        [[tenant, namespace, tier, seconds]] = acct["gpu_seconds"]
        assert (tenant, namespace, tier) == ("local/(departed)", "local", 0) and seconds > 0
        assert acct["gpu_seconds_by_gpu"] == [[GPU, "local/(departed)", seconds]]
        assert acct["gpu_seconds_by_namespace"] == {"local": round(seconds, 6)}
        assert acct["departed"] == []
    finally:
        agent.stop()

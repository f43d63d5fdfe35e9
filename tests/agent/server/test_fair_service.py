"""The fair policy in a running agent: tiers order the queue, waits are explained, time is
accounted per tenant, namespace and tier and survives a restart."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agent.client import AcquireTimeout, Baton, BatonError
from agent.core.events import Event
from agent.core.fair import FairConfig
from agent.core.residency import NullPreparer
from tests.harness.agent import AgentRunner


@pytest.fixture
def fair_agent(workdir: str) -> Iterator[AgentRunner]:
    runner = AgentRunner(workdir, queue_policy="fair", fair=FairConfig(min_share=0.0)).start()
    yield runner
    runner.stop()


def _client(agent: AgentRunner, name: str, priority: int = 0, duty: int = 50) -> Baton:
    return Baton(agent.config.socket, ["GPU-0"], name=name, gpu_duty=duty, priority=priority)


def _queued(tenant: str) -> Callable[[Event], bool]:
    return lambda e: e.kind == "queued" and e.tenant_id == tenant


def _acquire_until_closed(client: Baton) -> None:
    """A waiter in a thread: its client closed under it at the test's end is not an error (it
    hears "closed"; a waiter whose agent went first hears AgentUnavailable)."""
    with contextlib.suppress(BatonError):
        client.acquire()


def test_a_higher_tier_waiter_goes_first_and_every_waiter_sees_why(fair_agent: AgentRunner):
    holder, low, high = (
        _client(fair_agent, "holder"),
        _client(fair_agent, "low"),
        _client(fair_agent, "high", priority=1000),
    )
    try:
        holder.acquire()
        for each, tenant in ((low, "local/low"), (high, "local/high")):
            mark = fair_agent.mark()
            threading.Thread(target=_acquire_until_closed, args=(each,), daemon=True).start()
            fair_agent.wait_event(_queued(tenant), since=mark)
        queue = fair_agent.status()["gpus"]["GPU-0"]["queue"]
        assert [(w["tenant_id"], w["position"], w["tier"]) for w in queue] == [
            ("local/high", 1, 1000),
            ("local/low", 2, 0),
        ]
        assert queue[1]["share_entitled"] == 0.5
        assert "behind holder local/holder, local/high" in queue[1]["why"]
        mark = fair_agent.mark()
        holder.yield_()
        granted = fair_agent.wait_event(lambda e: e.kind == "granted", since=mark)
        assert granted.tenant_id == "local/high", "the higher tier at the holder's next yield"
        metrics = fair_agent.http("/metrics")[1]
        assert 'baton_tier_wait_seconds_count{tier="1000"} 1.0' in metrics
        assert 'baton_tier_wait_seconds_count{tier="0"} 1.0' in metrics  # the first holder
    finally:
        for each in (holder, low, high):
            each.close()


def test_a_timed_out_acquire_carries_the_last_reason(fair_agent: AgentRunner):
    a, b = _client(fair_agent, "a"), _client(fair_agent, "b")
    try:
        a.acquire()
        with pytest.raises(AcquireTimeout) as late:
            b.acquire(timeout=0.3)
        assert "position 1 (GPU-0 behind holder local/a); tier 0" in late.value.reason
        assert "of entitled 50%" in late.value.reason
    finally:
        a.close()
        b.close()


def test_gpu_seconds_are_accounted_and_survive_a_restart(workdir: str):
    agent = AgentRunner(workdir, queue_policy="fair").start()
    a = _client(agent, "a")
    try:
        a.acquire()
        a.yield_()
        first = agent.status()["accounting"]
        assert first["gpu_seconds_by_namespace"]["local"] > 0
        [[tenant, namespace, tier, seconds]] = first["gpu_seconds"]
        assert (tenant, namespace, tier) == ("local/a", "local", 0)
        assert first["gpu_seconds_by_gpu"] == [["GPU-0", "local/a", seconds]]
        assert "baton_tenant_gpu_seconds_total" in agent.http("/metrics")[1]
    finally:
        a.close()
        agent.stop()
    again = AgentRunner(workdir, queue_policy="fair").start()
    try:
        kept = again.status()["accounting"]
        assert kept["gpu_seconds"] == [[tenant, namespace, tier, seconds]]
        assert kept["gpu_seconds_by_gpu"] == [["GPU-0", "local/a", seconds]]
    finally:
        again.stop()


def test_a_turn_ended_by_its_tenant_leaving_is_accounted_in_its_tier(fair_agent: AgentRunner):
    a = _client(fair_agent, "a", priority=1000)
    a.acquire()
    a.yield_()
    a.acquire()
    mark = fair_agent.mark()
    a.close()  # its last session ends while it holds the turn: the tenant is dropped
    fair_agent.wait_event(lambda e: e.kind == "tenant_gone", since=mark, timeout=5)
    rows = fair_agent.status()["accounting"]["gpu_seconds"]
    assert [row[:3] for row in rows] == [["local/a", "local", 1000]]


def test_a_tenant_that_reconnects_comes_back_with_its_debt(workdir: str):
    # "greedy" (duty 1) holds 50 ms: 5 s of its virtual time, against "other"'s (duty 100)
    # few ms. Closing its session and opening a new one must not bring it back level.
    fair = FairConfig(min_share=0.0, anticipate_s=5.0)  # the GPU is kept for an owed yielder
    runner = AgentRunner(workdir, queue_policy="fair", fair=fair).start()
    greedy, other = _client(runner, "greedy", duty=1), _client(runner, "other", duty=100)
    try:
        greedy.acquire()
        mark = runner.mark()
        waiting = threading.Thread(target=_acquire_until_closed, args=(other,), daemon=True)
        waiting.start()
        runner.wait_event(_queued("local/other"), since=mark)
        time.sleep(0.05)  # the turn's work
        greedy.yield_()
        waiting.join(timeout=10)
        assert not waiting.is_alive(), "other has the GPU"
        mark = runner.mark()
        greedy.close()
        gone = runner.wait_event(lambda e: e.kind == "tenant_gone", since=mark, timeout=5)
        assert gone.tenant_id == "local/greedy"
        greedy = _client(runner, "greedy", duty=1)
        mark = runner.mark()
        threading.Thread(target=_acquire_until_closed, args=(greedy,), daemon=True).start()
        runner.wait_event(_queued("local/greedy"), since=mark)
        other.yield_()
        other.acquire(timeout=2)  # still owed: greedy is 5 s ahead, not level with it
    finally:
        for each in (greedy, other):
            each.close()
        runner.stop()


class _ParkedA(NullPreparer):
    """Tenant local/a's GiB is parked on GPU-0, and nothing on the node changes."""

    def status(self) -> dict[str, Any]:
        return {"tenants": {"local/a": {"gpus": {"GPU-0": "parked"}, "parked_bytes": 1 << 30}}}

    def parked_by_tenant(self) -> dict[str, int]:
        return {"local/a": 1 << 30}


def _parked_byte_seconds(agent: AgentRunner) -> float:
    for line in agent.http("/metrics")[1].splitlines():
        name, _, rest = line.partition("{")
        if name == "baton_tenant_parked_byte_seconds_total" and 'tenant="local/a"' in rest:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_parked_byte_seconds_a_scrape_showed_do_not_go_back_across_a_restart(workdir: str):
    """A counter that went down after a restart reads to Prometheus as a reset: `increase()`
    would count the whole total again."""
    agent = AgentRunner(workdir, preparer=_ParkedA()).start()
    try:
        first = _parked_byte_seconds(agent)
        shown = _parked_byte_seconds(agent)  # the integral since the first scrape
        assert shown > first
    finally:
        agent.stop()
    again = AgentRunner(workdir, preparer=NullPreparer()).start()
    try:
        assert _parked_byte_seconds(again) >= shown
    finally:
        again.stop()


def test_a_turn_held_across_a_restart_keeps_its_tier(workdir: str):
    """The restored holder is still in its tier: a lower tier's waiter does not revoke it by
    the tier grace, and its turn is accounted in its own tier, not tier 0."""
    fair = FairConfig(tier_grace_s=0.2)
    first = AgentRunner(workdir, queue_policy="fair", fair=fair, reconnect_grace=30).start()
    a = _client(first, "a", priority=1000)
    low = None
    second = None
    try:
        lease = a.acquire()
        first.stop()
        second = AgentRunner(workdir, queue_policy="fair", fair=fair, reconnect_grace=30).start()
        second.wait_event(lambda e: e.kind == "connected" and e.tenant_id == "local/a")
        low = _client(second, "low", priority=10)
        mark = second.mark()
        threading.Thread(target=_acquire_until_closed, args=(low,), daemon=True).start()
        second.wait_event(_queued("local/low"), since=mark)

        def revoke_at(service: Any) -> tuple[float | None, float]:
            held = service.table.leases[lease.lease_id]
            return service.table.revoke_at(held), held.hold_until

        at, hold_until = second.inspect(revoke_at)
        assert at == hold_until, "only the maximum hold, not a tier-10 waiter's grace"
        mark = second.mark()
        a.yield_()
        second.wait_event(lambda e: e.kind == "granted" and e.tenant_id == "local/low", since=mark)
        rows = second.status()["accounting"]["gpu_seconds"]
        assert [row[:3] for row in rows] == [["local/a", "local", 1000]]
    finally:
        for each in (a, low):
            if each is not None:
                each.close()
        if second is not None:
            second.stop()


def _ahead(agent: AgentRunner, greedy: Any, other: Any, hold_s: float) -> None:
    """`greedy` holds the GPU for `hold_s` while `other` waits, then `other` takes its turn."""
    greedy.acquire()
    mark = agent.mark()
    waiting = threading.Thread(target=_acquire_until_closed, args=(other,), daemon=True)
    waiting.start()
    agent.wait_event(_queued("local/other"), since=mark)
    time.sleep(hold_s)  # the turn's work
    greedy.yield_()
    waiting.join(timeout=10)
    assert not waiting.is_alive(), "other has the GPU"
    other.yield_()


def test_a_tenant_ahead_of_its_share_is_still_ahead_after_a_restart(workdir: str):
    # "greedy" (duty 1) holds 50 ms while "other" (duty 100) waits: 5 s of virtual time ahead
    # of it. The agent restarting between their turns (a DaemonSet upgrade) must not level them.
    fair = FairConfig(min_share=0.0, anticipate_s=5.0)  # the GPU is kept for an owed yielder

    def agent() -> AgentRunner:
        return AgentRunner(workdir, queue_policy="fair", fair=fair, reconnect_grace=30).start()

    first, second = agent(), None
    greedy, other = _client(first, "greedy", duty=1), _client(first, "other", duty=100)
    try:
        _ahead(first, greedy, other, hold_s=0.05)
        first.stop()
        second = agent()
        other.acquire(timeout=5)
        mark = second.mark()
        threading.Thread(target=_acquire_until_closed, args=(greedy,), daemon=True).start()
        second.wait_event(_queued("local/greedy"), since=mark)
        other.yield_()
        other.acquire(timeout=2)  # still owed: greedy is 5 s ahead, not level with it
    finally:
        for each in (greedy, other):
            each.close()
        if second is not None:
            second.stop()


def test_a_tenant_in_debt_that_does_not_come_back_after_a_restart_keeps_its_debt(workdir: str):
    # "greedy" (duty 1) ends 10 s of virtual time ahead of "other", then dies while the agent is
    # down; the restarted agent drops it after the grace, before it took a turn there. Its debt
    # must outlive it as any departed tenant's does: back under the same id, it is still ahead.
    fair = FairConfig(min_share=0.0, anticipate_s=5.0)  # the GPU is kept for an owed yielder
    first = AgentRunner(workdir, queue_policy="fair", fair=fair, reconnect_grace=30).start()
    second = None
    greedy, other = _client(first, "greedy", duty=1), _client(first, "other", duty=100)
    again = None
    try:
        _ahead(first, greedy, other, hold_s=0.1)
        first.stop()
        greedy.close()  # gone while the agent is down
        second = AgentRunner(workdir, queue_policy="fair", fair=fair, reconnect_grace=1.5).start()
        other.acquire(timeout=5)  # back within the grace
        other.yield_()
        gone = second.wait_event(lambda e: (e.kind, e.tenant_id) == ("tenant_gone", "local/greedy"))
        assert "did not reconnect" in gone.detail
        again = _client(second, "greedy", duty=1)
        other.acquire(timeout=5)
        mark = second.mark()
        threading.Thread(target=_acquire_until_closed, args=(again,), daemon=True).start()
        second.wait_event(_queued("local/greedy"), since=mark)
        other.yield_()
        other.acquire(timeout=2)  # still owed: greedy came back 10 s ahead, not level with it
    finally:
        for each in (greedy, other, *([again] if again else [])):
            each.close()
        if second is not None:
            second.stop()

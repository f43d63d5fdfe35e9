"""A self-parking tenant restores itself as its grant arrives: the agent leaves that restore to
the acquiring thread instead of asking for it by callback ahead of the grant, nothing is lost
if the grant never takes it up, and a restore that fails gives the turn back."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agent.client import AsyncBaton, Baton, LeaseInfo
from agent.client.callback_runner import CallbackRunner
from agent.client.errors import BatonError
from agent.core.events import GRANTED, QUEUED
from agent.parking.setup import ParkingOptions
from baton._pb import agent_pb2 as pb
from baton.contract.names import MIB
from tests.agent.client.test_client_close import GPU, WAIT_S, app_agent
from tests.harness.agent import AgentRunner

pytestmark = pytest.mark.timeout(60)
__all__ = ["app_agent"]  # the fixture, used by name


class Recorded:
    """on_park/on_restore that record which thread ran them; a restore may be made to fail."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail_restores = 0

    def park(self, gpu: str) -> int:
        self.calls.append(("park", threading.current_thread().name))
        return 60 * MIB

    def restore(self, gpu: str) -> int:
        self.calls.append(("restore", threading.current_thread().name))
        if self.fail_restores:
            self.fail_restores -= 1
            raise RuntimeError("out of device memory")
        return 60 * MIB


Pair = tuple[AgentRunner, dict[str, Recorded], dict[str, Baton]]


def two_tenants(agent: AgentRunner, park_at_yield: bool) -> Iterator[Pair]:
    """Two 60 MiB tenants of an app-method agent whose 100 MiB GPU holds one: every switch
    parks one and restores the other."""
    recorded = {name: Recorded() for name in ("a", "b")}
    clients = {
        name: Baton(
            agent.socket,
            [GPU],
            name=name,
            gpu_memory_mib=60,
            on_park=r.park,
            on_restore=r.restore,
            park_at_yield=park_at_yield,
        )
        for name, r in recorded.items()
    }
    try:
        yield agent, recorded, clients
    finally:
        for client in clients.values():
            client.close()


@pytest.fixture
def pair(app_agent: AgentRunner) -> Iterator[Pair]:
    """`two_tenants`, each park by callback (test_park_at_yield: the other way)."""
    yield from two_tenants(app_agent, park_at_yield=False)


def sample(agent: AgentRunner, name: str, **labels: str) -> float:
    registry = agent.agent.parking.metrics.registry  # type: ignore[union-attr]
    return registry.get_sample_value(name, {"backend": "app", **labels}) or 0.0


def switch(agent: AgentRunner, clients: dict[str, Baton], leaving: str, coming: str) -> None:
    """`leaving` holds the turn and `coming` queues for it; `leaving` yields; `coming` holds."""
    holder = clients[leaving]
    holder.acquire(WAIT_S)
    taker = taking(agent, clients[coming], lambda: clients[coming].acquire(WAIT_S))
    holder.yield_()
    taker.join(WAIT_S)
    assert not taker.is_alive(), f"{coming} was never granted"


def taking(agent: AgentRunner, client: Baton, acquire: Callable[[], object]) -> threading.Thread:
    """`acquire` on a thread named `taker`, returned once the agent has the client queued."""
    client.connect()
    since = agent.mark()
    taker = threading.Thread(target=acquire, name="taker")
    taker.start()
    assert client.tenant is not None
    tenant_id = client.tenant.tenant_id
    agent.wait_event(lambda e: e.kind == QUEUED and e.tenant_id == tenant_id, WAIT_S, since)
    return taker


def test_the_incoming_tenant_restores_itself_on_its_acquiring_thread(pair: Pair) -> None:
    agent, recorded, clients = pair
    switch(agent, clients, "a", "b")  # b fits only once a is parked; b was never parked
    switch(agent, clients, "b", "a")  # a was parked: its restore comes with its grant
    assert recorded["a"].calls == [("park", "baton-client"), ("restore", "taker")]
    assert recorded["b"].calls == [("park", "baton-client")]
    assert clients["a"].lease is not None
    handed = sample(agent, "baton_moved_bytes_by_stage_total", direction="restore", stage="handed")
    assert handed == 60 * MIB
    assert sample(agent, "baton_moves_total", direction="restore") == 1
    assert sample(agent, "baton_move_seconds_count", direction="restore") == 0  # not the agent's
    timings = clients["a"].callback_timings
    assert [t.action for t in timings] == ["park", "restore"]
    restore = timings[1]
    assert restore.received == restore.started <= restore.finished == restore.answered


def test_a_restore_that_fails_gives_the_turn_back_and_runs_again_next_grant(pair: Pair) -> None:
    agent, recorded, clients = pair
    switch(agent, clients, "a", "b")  # b holds the turn; a is parked
    recorded["a"].fail_restores = 1
    failed: list[BaseException] = []

    def take() -> None:
        try:
            clients["a"].acquire(WAIT_S)
        except BatonError as exc:
            failed.append(exc)

    taker = taking(agent, clients["a"], take)
    clients["b"].yield_()
    taker.join(WAIT_S)
    assert len(failed) == 1 and f"on_restore({GPU}) failed" in str(failed[0])
    assert "out of device memory" in str(failed[0]) and "given back" in str(failed[0])
    assert clients["a"].lease is None
    # Its yield said a's memory is still parked: the agent counts it in host memory again, beside
    # b's (parked for a's turn).
    residency = agent.status()["residency"]
    for name in ("a", "b"):
        tenant = clients[name].tenant
        assert tenant is not None
        assert residency["tenants"][tenant.tenant_id]["residency"] == "parked", name
    assert residency["parked_bytes"] == 2 * 60 * MIB
    # The turn is free again (b takes it at once), and a's next grant restores it after all.
    switch(agent, clients, "b", "a")
    assert [c for c, _ in recorded["a"].calls] == ["park", "restore", "restore"]
    assert clients["a"].lease is not None


def test_a_park_asked_of_a_gpu_still_parked_is_answered_with_what_that_park_moved() -> None:
    """A grant that left the restore to this process may never have reached it (its acquire
    gave up just then): the agent counts it resident and may ask it to park again."""
    answers: list[pb.CallbackResult] = []
    parks: list[str] = []

    def park(gpu: str) -> int:
        parks.append(gpu)
        return 7

    runner = CallbackRunner({"park": park, "restore": lambda gpu: 7}, answers.append)
    runner.run(pb.Callback(call_id="1", action="park", gpu="g"))
    runner.run(pb.Callback(call_id="2", action="park", gpu="g"))
    assert parks == ["g"] and runner.parked.bytes == {"g": 7}
    assert [(a.call_id, a.bytes, a.error) for a in answers] == [("1", 7, ""), ("2", 7, "")]
    # While an acquire is in flight, a park of it is a revocation that overtook the restore
    # that acquire's grant owes: refused, so that the agent asks again once it is restored.
    with runner.parked.acquiring():
        runner.run(pb.Callback(call_id="3", action="park", gpu="g"))
        runner.restore_parked()
    assert answers[2].call_id == "3" and "on_park(g) not run: still parked" in answers[2].error
    assert parks == ["g"] and runner.parked.bytes == {}
    assert [t.action for t in runner.timings][-1] == "restore"
    runner.run(pb.Callback(call_id="4", action="park", gpu="g"))
    assert parks == ["g", "g"] and (answers[3].bytes, answers[3].error) == (7, "")
    assert runner.close(WAIT_S)
    with pytest.raises(BatonError, match="closing"):
        runner.restore_parked()


def test_a_tenant_with_two_parking_sessions_is_restored_by_callback(pair: Pair) -> None:
    """Which of its processes parked is then not the one that asks: the agent restores them
    (each parked its own memory, and each restores it)."""
    agent, recorded, clients = pair
    second = Recorded()
    twin = Baton(
        agent.socket, [GPU], name="a", gpu_memory_mib=60,
        on_park=second.park, on_restore=second.restore,
    )  # fmt: skip
    try:
        twin.connect()
        assert twin.tenant is not None and clients["a"].tenant is None
        switch(agent, clients, "a", "b")
        assert clients["a"].tenant is not None
        assert clients["a"].tenant.tenant_id == twin.tenant.tenant_id
        switch(agent, clients, "b", "a")
        for calls in (recorded["a"].calls, second.calls):
            assert [c for c in calls if c[0] == "restore"] == [("restore", "baton-client")]
        assert sample(agent, "baton_move_seconds_count", direction="restore") == 1
    finally:
        twin.close()


def async_client(agent: AgentRunner, name: str, r: Recorded) -> AsyncBaton:
    return AsyncBaton(
        agent.socket, [GPU], name=name, gpu_memory_mib=60,
        on_park=r.park, on_restore=r.restore, park_at_yield=False,
    )  # fmt: skip


async def queued_behind(
    agent: AgentRunner, holder: AsyncBaton, waiter: AsyncBaton
) -> asyncio.Task[LeaseInfo]:
    """`holder` takes the turn and `waiter` queues for it; the waiter's acquire, once queued."""
    await holder.acquire(WAIT_S)
    since = await asyncio.to_thread(agent.mark)
    taking = asyncio.create_task(waiter.acquire(WAIT_S))
    assert waiter.tenant is not None
    tenant_id = waiter.tenant.tenant_id
    queued = functools.partial(
        agent.wait_event, lambda e: e.kind == QUEUED and e.tenant_id == tenant_id
    )
    await asyncio.to_thread(queued, WAIT_S, since)
    return taking


def test_the_async_client_restores_itself_with_its_grant(app_agent: AgentRunner) -> None:
    recorded = {name: Recorded() for name in ("x", "y")}

    async def handover(holder: AsyncBaton, waiter: AsyncBaton) -> None:
        taking = await queued_behind(app_agent, holder, waiter)
        await holder.yield_()
        await asyncio.wait_for(taking, WAIT_S)

    async def scenario() -> None:
        x = async_client(app_agent, "x", recorded["x"])
        async with x, async_client(app_agent, "y", recorded["y"]) as y:
            await handover(x, y)  # x parked by callback
            await handover(y, x)  # x restores itself with its grant
            assert x.lease is not None and x.parked.bytes == {}

    asyncio.run(scenario())
    # Both connected first, so x's first turn parked y; each later grant left a restore to it.
    assert [c for c, _ in recorded["x"].calls] == ["park", "restore"]
    assert [c for c, _ in recorded["y"].calls] == ["park", "restore", "park"]
    stage = {"direction": "restore", "stage": "handed"}
    assert sample(app_agent, "baton_moved_bytes_by_stage_total", **stage) == 2 * 60 * MIB
    assert sample(app_agent, "baton_move_seconds_count", direction="restore") == 0


@pytest.mark.parametrize("cancels", [1, 2])
def test_an_async_acquire_cancelled_in_its_restore_finishes_it_and_gives_the_turn_back(
    app_agent: AgentRunner, cancels: int
) -> None:
    """Cancelled twice too (a timeout, then a shutdown): the second cancel lands while the
    first waits for the restore, and cuts neither it nor the give-back short."""
    recorded = {name: Recorded() for name in ("x", "y")}
    started, gate = threading.Event(), threading.Event()
    restore = recorded["x"].restore

    def gated_restore(gpu: str) -> int:
        started.set()
        gate.wait(WAIT_S)
        return restore(gpu)

    recorded["x"].restore = gated_restore  # type: ignore[method-assign]

    async def scenario() -> None:
        x = async_client(app_agent, "x", recorded["x"])
        async with x, async_client(app_agent, "y", recorded["y"]) as y:
            taking = await queued_behind(app_agent, x, y)
            await x.yield_()
            await asyncio.wait_for(taking, WAIT_S)  # y holds; x is parked
            taking = await queued_behind(app_agent, y, x)
            await y.yield_()
            assert await asyncio.to_thread(started.wait, WAIT_S), "x's restore never ran"
            taking.cancel()
            if cancels == 2:
                await asyncio.sleep(0)  # one step: the acquire waits for its restore
                taking.cancel()
            gate.set()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(taking, WAIT_S)
            # The restore ran to its end (nothing parked twice), and the turn is free: y takes
            # it at once, parking x again.
            assert x.lease is None and x.parked.bytes == {}
            await y.acquire(WAIT_S)

    asyncio.run(scenario())
    assert [c for c, _ in recorded["x"].calls] == ["park", "restore", "park"]


def test_a_revocation_during_the_restore_a_grant_owes_parks_only_once_it_is_done(
    workdir: str,
) -> None:
    # a's grant leaves its restore to it; the restore is slow, a's turn runs past --max-hold
    # while b waits, and the revocation's park reaches a's process during that restore. It
    # waits for the restore, then parks what was restored: b is granted only after.
    options = ParkingOptions(backend="app", fake_gpus="1x100")
    with AgentRunner(workdir, parking=options, max_hold=0.5) as agent:
        order: list[str] = []
        recorded = {name: Recorded() for name in ("a", "b")}
        gate, restoring, park_asked = threading.Event(), threading.Event(), threading.Event()

        def logged(name: str, action: str, fn: Callable[[str], int]) -> Callable[[str], int]:
            def call(gpu: str) -> int:
                if name == "a" and action == "restore" and order.count("a park") == 1:
                    restoring.set()
                    assert gate.wait(WAIT_S), "the test never let a's restore finish"
                moved = fn(gpu)
                order.append(f"{name} {action}")
                return moved

            return call

        def client(name: str, r: Recorded) -> Baton:
            park, restore = logged(name, "park", r.park), logged(name, "restore", r.restore)
            return Baton(
                agent.socket, [GPU], name=name, gpu_memory_mib=60,
                on_park=park, on_restore=restore, park_at_yield=False,
            )  # fmt: skip

        clients = {name: client(name, r) for name, r in recorded.items()}
        runner = clients["a"]._callbacks_run
        run = runner._run

        def arriving(request: pb.Callback, *rest: Any) -> Any:
            if request.action == "park" and restoring.is_set():
                park_asked.set()
            return run(request, *rest)

        runner._run = arriving  # type: ignore[method-assign,assignment]
        try:
            switch(agent, clients, "a", "b")  # b holds; a is parked
            taker = taking(agent, clients["a"], lambda: clients["a"].acquire(WAIT_S))
            clients["b"].yield_()  # a is granted; its restore is left to it, and waits
            assert restoring.wait(WAIT_S), "a's grant did not leave its restore to it"
            since = agent.mark()
            b_takes = taking(agent, clients["b"], lambda: clients["b"].acquire(WAIT_S))
            assert park_asked.wait(WAIT_S), "a was never revoked during its restore"
            gate.set()
            for thread in (taker, b_takes):
                thread.join(WAIT_S)
                assert not thread.is_alive()
            granted = agent.wait_event(lambda e: e.kind == GRANTED, WAIT_S, since)
            assert granted.tenant_id == clients["b"].tenant.tenant_id  # type: ignore[union-attr]
        finally:
            gate.set()
            for each in clients.values():
                each.close()
    # a's restore finished before the revocation's park ran, and b's memory came back after.
    assert order == [
        "a park",  # b's first grant parked a (b had allocated nothing: no restore)
        "b park", "a restore",  # a's grant parked b and left a's restore to a
        "a park", "b restore",  # the revocation's park, after it; then b's grant
    ]  # fmt: skip

"""The client across an agent restart: waiters retry through it, kept turns stay kept."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from agent.client import AcquireTimeout, AgentUnavailable, AsyncBaton, Baton, LeaseInfo
from baton._pb import agent_pb2 as pb
from baton.contract.names import fake_gpu_uuid
from commands.demo.fakenode import AgentProcess, FakeNodeOptions
from tests.agent.client.resume_clients import call, client, gate_reconnects, holder, queue, until
from tests.harness.agent import AgentRunner

pytestmark = pytest.mark.timeout(60)


async def contended(holder: AsyncBaton, lease: LeaseInfo, within: float = 10) -> None:
    """Return once the agent reports someone waiting behind `lease` (asked over the session)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not (await holder._renew(lease.lease_id)).contended:
        assert loop.time() < deadline, "the waiter never queued"


def test_a_waiter_retries_through_an_agent_killed_and_restarted(workdir: str) -> None:
    node = AgentProcess(workdir, FakeNodeOptions(backend="app", reconnect_grace=30))
    gpu = fake_gpu_uuid(0)

    async def scenario() -> None:
        holder = AsyncBaton(node.socket, [gpu], name="holder", connect_timeout=20)
        waiter = AsyncBaton(node.socket, [gpu], name="waiter", connect_timeout=20)
        try:
            held = await holder.acquire()
            waiting = asyncio.create_task(waiter.acquire(timeout=30))
            await contended(holder, held)
            await asyncio.to_thread(node.kill)
            with pytest.raises(AgentUnavailable, match="reconnecting"):
                await asyncio.wait_for(waiting, 10)
            retry = asyncio.create_task(waiter.acquire(timeout=30))  # waits for the reconnect
            await asyncio.to_thread(node.start)
            assert not retry.done() or retry.exception() is None
            await asyncio.wait_for(holder.yield_(), 20)  # the holder kept its turn; it ends it
            granted = await asyncio.wait_for(retry, 20)
            assert granted.fencing_tokens[gpu] == held.fencing_tokens[gpu] + 1
            await waiter.yield_()
        finally:
            await holder.close()
            await waiter.close()

    node.start()
    try:
        asyncio.run(scenario())
    except Exception as err:  # what the restarted agent did with the turns it restored
        err.add_note("the restarted agent's log:\n" + "\n".join(node.lines[-80:]))
        raise
    finally:
        node.stop()


def hold_reconnect(tenant: Baton | AsyncBaton) -> threading.Event:
    """The client's reconnect waits (20 s at most) until the returned event is set, then
    opens the session: an agent that takes that long to come back."""
    gate = threading.Event()
    opens: Any = tenant._open
    if isinstance(tenant, AsyncBaton):

        async def held_async() -> None:
            await asyncio.to_thread(gate.wait, 20)
            await opens()

        tenant._open = held_async  # type: ignore[method-assign]
    else:

        def held() -> Any:
            gate.wait(20)
            return opens()

        tenant._open = held  # type: ignore[method-assign]
    return gate


@pytest.mark.parametrize("kind", ["blocking", "asyncio"])
def test_an_acquire_that_waited_for_the_reconnect_ends_within_its_timeout(
    workdir: str, kind: str
) -> None:
    """An acquire made while the agent restarts waits for the reconnect, then queues with what
    is left of its timeout, not the whole timeout again: it gives up when its timeout ends."""
    first = AgentRunner(workdir, reconnect_grace=30).start()
    second = AgentRunner(workdir, reconnect_grace=30)
    timeout = 2.0

    async def scenario() -> None:
        holder = AsyncBaton(first.socket, ["GPU-0"], name="holder", connect_timeout=5)
        waiter = client(kind, first.socket, "waiter")
        try:
            await holder.acquire()
            await call(waiter.connect)
            gate = hold_reconnect(waiter)
            await asyncio.to_thread(first.stop)
            await asyncio.to_thread(second.start)  # the holder keeps its turn
            loop = asyncio.get_running_loop()
            started = loop.time()
            waiting = asyncio.ensure_future(call(waiter.acquire, timeout))
            await asyncio.sleep(timeout / 2)  # the waiter's agent is away half its timeout
            gate.set()
            with pytest.raises(AcquireTimeout, match="behind holder local/holder"):
                await asyncio.wait_for(waiting, 3 * timeout)
            assert loop.time() - started < timeout * 1.25
        finally:
            await call(waiter.close)
            await holder.close()

    try:
        asyncio.run(scenario())
    finally:
        first.stop()
        second.stop()


def test_a_call_on_a_broken_session_without_reconnect_fails_at_once(workdir: str) -> None:
    runner = AgentRunner(workdir).start()

    async def scenario() -> None:
        client = AsyncBaton(runner.socket, ["GPU-0"], name="once", reconnect=False)
        try:
            await client.acquire()
            await asyncio.to_thread(runner.stop)
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(AgentUnavailable, match=r"reconnect=False|lost"):
                await client.yield_()
            with pytest.raises(AgentUnavailable, match="reconnect=False"):
                await client.yield_()  # the turn is kept for a retry, which fails at once too
            with pytest.raises(AgentUnavailable, match="reconnect=False"):
                await client.acquire()  # not the turn the session took with it
            assert client.lease is None
            assert loop.time() - started < 5
        finally:
            await client.close()

    try:
        asyncio.run(scenario())
    finally:
        runner.stop()


def test_a_yield_while_the_turn_is_reclaimed_is_not_undone(workdir: str) -> None:
    """The renewal that reclaims a turn after a restart and the holder's yield cross."""
    first = AgentRunner(workdir, reconnect_grace=30).start()
    second = AgentRunner(workdir, reconnect_grace=30)

    async def scenario() -> None:
        client = AsyncBaton(first.socket, ["GPU-0"], name="keeper", renew_interval=60)
        renew = client._renew
        yielded = asyncio.Event()

        async def renew_then_yield(lease_id: str) -> LeaseInfo:
            renewed = await renew(lease_id)
            await client.yield_()  # lands before the reclaim sees the renewal's reply
            yielded.set()
            return renewed

        try:
            lease = await client.acquire()
            client._renew = renew_then_yield  # type: ignore[method-assign]
            await asyncio.to_thread(first.stop)
            await asyncio.to_thread(second.start)
            await asyncio.wait_for(yielded.wait(), 20)
            client._renew = renew  # type: ignore[method-assign]
            assert client.lease is None
            again = await asyncio.wait_for(client.acquire(timeout=5), 10)
            assert again.lease_id != lease.lease_id
            await client.yield_()
        finally:
            await client.close()

    try:
        asyncio.run(scenario())
    finally:
        first.stop()
        second.stop()


def _answer_lost_once(baton: Baton | AsyncBaton) -> None:
    """The next yield reaches the agent and is carried out, but its answer is lost as if the
    agent had gone away then (the caller sees AgentUnavailable); later calls go through."""
    real: Any = baton._request
    lost: list[str] = []

    def cut(request: pb.Request, *args: Any, **kwargs: Any) -> Any:
        if request.HasField("release") and not lost:
            lost.append(request.release.lease_id)
            if isinstance(baton, AsyncBaton):

                async def sent() -> None:
                    await real(request, *args, **kwargs)
                    raise AgentUnavailable("the agent went away before it answered")

                return sent()
            real(request, *args, **kwargs)
            raise AgentUnavailable("the agent went away before it answered")
        return real(request, *args, **kwargs)

    baton._request = cut  # type: ignore[method-assign]


def test_a_yield_whose_answer_was_lost_ends_the_turn_quietly_when_made_again() -> None:
    """The agent ended the turn (and granted the next); the tenant, told AgentUnavailable, holds
    the turn again as far as it knows and makes the yield again, as it should: the agent has no
    such lease any more, and the yield ends nothing and raises nothing. A lease that was never
    cut off still raises LeaseLost."""
    with AgentRunner() as agent:
        with Baton(agent.socket, ["GPU-0"], name="sync") as baton:
            lease = baton.acquire()
            _answer_lost_once(baton)
            with pytest.raises(AgentUnavailable):
                baton.yield_()
            assert baton.lease is lease  # held again: the yield may not have arrived
            baton.yield_()  # "no such lease": the first yield had ended it
            assert baton.lease is None and agent.status()["gpus"]["GPU-0"]["holder"] is None

        async def scenario() -> None:
            async with AsyncBaton(agent.socket, ["GPU-0"], name="async") as baton:
                await baton.acquire()
                _answer_lost_once(baton)
                with pytest.raises(AgentUnavailable):
                    await baton.yield_()
                await baton.yield_()
                assert baton.lease is None

        asyncio.run(scenario())


def _cut_off_once(baton: Baton | AsyncBaton) -> None:
    """The next yield is cut off before it leaves, as if the agent had gone away then (the
    caller sees AgentUnavailable); later calls go through."""
    real: Any = baton._request
    cut: list[str] = []

    def never_sent(request: pb.Request, *args: Any, **kwargs: Any) -> Any:
        if request.HasField("release") and not cut:
            cut.append(request.release.lease_id)
            raise AgentUnavailable("the agent went away before the yield left")
        return real(request, *args, **kwargs)

    if isinstance(baton, AsyncBaton):

        async def never_sent_async(request: pb.Request, *args: Any, **kwargs: Any) -> Any:
            return await never_sent(request, *args, **kwargs)

        baton._request = never_sent_async  # type: ignore[method-assign]
    else:
        baton._request = never_sent  # type: ignore[method-assign]


@pytest.mark.parametrize("kind", ["blocking", "asyncio"])
@pytest.mark.parametrize("reached", [True, False])
def test_an_acquire_after_a_yield_cut_off_by_a_restart_asks_the_agent_first(
    workdir: str, kind: str, reached: bool
) -> None:
    """x's yield is cut off by the agent going away, and x calls acquire() instead of making
    the yield again. `reached`: the yield had reached the agent (y was granted the turn): the
    acquire learns after the reconnect that the turn ended and queues behind y, never returning
    the ended turn while y holds the GPU. Otherwise the agent still has x's turn: returned."""
    first = AgentRunner(workdir, reconnect_grace=30).start()
    second = AgentRunner(workdir, reconnect_grace=30)

    async def scenario() -> None:
        kinds: dict[str, Any] = {"blocking": Baton, "asyncio": AsyncBaton}
        x = kinds[kind](first.socket, ["GPU-0"], name="x", connect_timeout=5, renew_interval=60)
        y = AsyncBaton(first.socket, ["GPU-0"], name="y", connect_timeout=5)
        try:
            old = await call(x.acquire)
            waiting = asyncio.ensure_future(y.acquire(timeout=20))
            await until(lambda: queue(first) == [("local/y", False)], "y queues behind x")
            (_answer_lost_once if reached else _cut_off_once)(x)
            with pytest.raises(AgentUnavailable):
                await call(x.yield_)
            gate = gate_reconnects(x)
            await asyncio.to_thread(first.stop)
            await asyncio.to_thread(second.start)
            assert holder(second) == ("local/y" if reached else "local/x")
            again = asyncio.ensure_future(call(x.acquire, 20))
            gate.set()
            if not reached:  # the agent still has x's turn: the same lease, held
                assert (await asyncio.wait_for(again, 10)).lease_id == old.lease_id
                with pytest.raises(AgentUnavailable, match="reconnecting"):
                    await asyncio.wait_for(waiting, 10)  # in flight as the agent went away
                await call(x.yield_)
                await asyncio.wait_for(y.acquire(timeout=10), 20)
                return
            theirs = await asyncio.wait_for(waiting, 10)
            await until(lambda: again.done() or bool(queue(second)), "x's acquire queues")
            assert not again.done(), f"acquire() returned {again.result()} while y holds the GPU"
            assert queue(second) == [("local/x", False)]
            await asyncio.wait_for(y.yield_(), 10)
            mine = await asyncio.wait_for(again, 10)
            assert mine.lease_id != old.lease_id
            assert mine.fencing_tokens["GPU-0"] == theirs.fencing_tokens["GPU-0"] + 1
            await call(x.yield_)
            assert holder(second) is None
        finally:
            await call(x.close)
            await y.close()

    try:
        asyncio.run(asyncio.wait_for(scenario(), 45))
    finally:
        first.stop()
        second.stop()

"""A tenant's first-day mistakes: a client used after close, on another event loop, in a forked
child. Each gets a one-line error that names it, and none costs another tenant its turn."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from agent.client import (
    AcquireTimeout,
    AgentUnavailable,
    AsyncBaton,
    Baton,
    BatonError,
    InvalidRequest,
    Refused,
)
from baton.contract.names import ENV_AGENT_SOCKET, ENV_GPUS
from tests.harness.agent import AgentRunner

pytestmark = pytest.mark.timeout(60)
WAIT_S = 10.0
"""Bound on every wait in these tests."""


def test_async_client_used_after_close_says_so_and_holds_nothing(agent: AgentRunner) -> None:
    async def scenario() -> None:
        never = AsyncBaton(agent.socket, ["GPU-0"], name="never")
        await never.close()
        used = AsyncBaton(agent.socket, ["GPU-0"], name="used")
        await used.acquire(timeout=WAIT_S)
        await used.yield_()
        await used.close()
        for closed in (never, used):
            with pytest.raises(BatonError, match="closed; create a new one"):
                await asyncio.wait_for(closed.acquire(timeout=1), WAIT_S)
        async with AsyncBaton(agent.socket, ["GPU-0"], name="next") as other:
            await other.acquire(timeout=WAIT_S)  # nobody holds GPU-0 for a closed client
            await other.yield_()

    asyncio.run(scenario())
    assert "local/never" not in agent.status()["tenants"]


def test_async_client_on_a_second_event_loop_says_so(agent: AgentRunner) -> None:
    baton = AsyncBaton(agent.socket, ["GPU-0"], name="loops", keep_turns=False)

    async def step() -> None:
        async with baton.turn(timeout=WAIT_S):
            pass

    asyncio.run(step())
    with pytest.raises(BatonError, match="another event loop"):
        asyncio.run(asyncio.wait_for(step(), WAIT_S))


def test_async_client_left_holding_a_turn_says_so_rather_than_hand_it_out_again(
    agent: AgentRunner,
) -> None:
    """Its loop ended (or it closed) with a turn held: the agent took the turn back with the
    session, so a later acquire must not return it as held."""
    ended = AsyncBaton(agent.socket, ["GPU-0"], name="ended")
    closed = AsyncBaton(agent.socket, ["GPU-0"], name="closed")

    async def hold(baton: AsyncBaton, close: bool) -> None:
        await baton.acquire(timeout=WAIT_S)
        if close:
            await baton.close()

    asyncio.run(hold(ended, close=False))  # asyncio.run returns with the turn held
    with pytest.raises(BatonError, match="another event loop"):
        asyncio.run(asyncio.wait_for(ended.acquire(timeout=WAIT_S), WAIT_S))
    asyncio.run(hold(closed, close=True))
    with pytest.raises(BatonError, match="closed; create a new one"):
        asyncio.run(asyncio.wait_for(closed.acquire(timeout=WAIT_S), WAIT_S))


def test_async_client_left_holding_a_turn_shows_no_lease(agent: AgentRunner) -> None:
    """Its loop ended (or it closed) with a turn held: the agent took the turn back with the
    session and granted it on, so `lease` must not still show it as held."""
    ended = AsyncBaton(agent.socket, ["GPU-0"], name="ended")
    closed = AsyncBaton(agent.socket, ["GPU-0"], name="closed")

    async def hold(baton: AsyncBaton, close: bool) -> None:
        await baton.acquire(timeout=WAIT_S)
        assert baton.lease is not None
        if close:
            await baton.close()

    asyncio.run(hold(ended, close=False))  # asyncio.run returns with the turn held
    asyncio.run(hold(closed, close=True))  # (granted: "ended" no longer holds GPU-0)
    assert ended.lease is None and not ended.resuming
    assert closed.lease is None and not closed.resuming


def test_a_client_closed_holding_a_turn_shows_no_lease(agent: AgentRunner) -> None:
    """The blocking client too: closed inside a turn, the agent took the turn back."""
    baton = Baton(agent.socket, ["GPU-0"], name="closed-sync")
    baton.acquire(timeout=WAIT_S)
    assert baton.lease is not None
    baton.close()
    assert baton.lease is None and not baton.resuming


def _fork_tenant(agent: AgentRunner, *args: str, pid: list[int] | None = None) -> str:
    """What `fork_tenant.py ARGS` printed (its process id put in `pid`), within 45 s."""
    script = Path(__file__).with_name("fork_tenant.py")
    env = {**os.environ, ENV_AGENT_SOCKET: agent.socket, ENV_GPUS: "GPU-0"}
    proc = subprocess.Popen(
        [sys.executable, str(script), *args],
        env=env,
        text=True,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    if pid is not None:
        pid.append(proc.pid)
    try:
        out, _ = proc.communicate(timeout=45)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(WAIT_S)
    return out


@pytest.mark.parametrize("client", ["Baton", "AsyncBaton"])
def test_a_forked_child_neither_uses_nor_ends_the_parents_session(
    agent: AgentRunner, client: str
) -> None:
    """The child's calls raise, and its exit (an `AsyncBaton`'s: `asyncio.run` cancelling the
    copy of its session's task) leaves the parent's turn, and its session, to the parent."""
    pid: list[int] = []
    out = _fork_tenant(agent, "forker", client, pid=pid)
    lines = out.splitlines()
    for call in ("connect", "acquire", "yield"):
        assert (
            f"child {call} raised BatonError: this Baton client's session belongs to "
            f"process {pid[0]}, which forked" in out
        ), out
    assert "child exited 0" in lines and "parent yielded" in lines, out
    assert "lost" not in out, out


@pytest.mark.parametrize("client", ["Baton", "AsyncBaton"])
def test_a_child_forked_inside_a_turn_leaves_through_the_block_quietly(
    agent: AgentRunner, client: str
) -> None:
    """A child leaving through the parent's `turn()` block (`sys.exit` after `os.fork()`)
    exits as it asked, with no traceback: the turn is the parent's to end, at its block's end."""
    out = _fork_tenant(agent, "in-turn", client, "in-turn")
    assert out.splitlines() == ["child exited 0", "parent yielded"], out


def test_acquire_names_gpus_as_the_constructor_does_and_refuses_others_while_holding(
    agent: AgentRunner,
) -> None:
    with Baton(agent.socket, "GPU-0,GPU-1", name="two") as baton:
        lease = baton.acquire(timeout=WAIT_S, gpus=["GPU-0"])
        assert baton.acquire(timeout=WAIT_S, gpus=["GPU-0"]) == lease  # the same ask: held
        with pytest.raises(Refused, match=r"holds a turn on \['GPU-0'\]: yield_\(\) it first"):
            baton.acquire(timeout=WAIT_S, gpus=["GPU-1"])
        baton.yield_()
        assert baton.acquire(timeout=WAIT_S, gpus="GPU-1, GPU-0").gpus == ("GPU-0", "GPU-1")
        assert baton.acquire(timeout=WAIT_S, gpus=["GPU-1", "GPU-0"]) == baton.lease  # held
        baton.yield_()

    async def scenario() -> None:
        async with AsyncBaton(agent.socket, "GPU-0,GPU-1", name="two-async") as baton:
            assert (await baton.acquire(timeout=WAIT_S, gpus="GPU-0")).gpus == ("GPU-0",)
            await baton.yield_()
            await baton.acquire(timeout=WAIT_S, gpus=["GPU-1"])
            with pytest.raises(Refused, match=r"holds a turn on \['GPU-1'\]"):
                await baton.acquire(timeout=WAIT_S, gpus=["GPU-0"])
            await baton.yield_()

    asyncio.run(scenario())


def test_threads_of_one_client_share_the_turn_one_waits_for(agent: AgentRunner) -> None:
    with (
        Baton(agent.socket, ["GPU-0"], name="holder") as holder,
        Baton(agent.socket, ["GPU-0"], name="shared") as shared,
        ThreadPoolExecutor(2) as pool,
    ):
        holder.acquire(timeout=WAIT_S)
        mark = agent.mark()
        first = pool.submit(shared.acquire, WAIT_S)
        agent.wait_event(lambda e: e.kind == "queued" and e.tenant_id == "local/shared", 5, mark)
        started = time.monotonic()
        with pytest.raises(AcquireTimeout) as late:  # bounded by its own timeout, not the other's
            shared.acquire(timeout=0.2)
        assert time.monotonic() - started < 5
        assert late.value.reason == "another thread's acquire on this client was still waiting"
        second = pool.submit(shared.acquire, WAIT_S)
        holder.yield_()
        assert first.result(WAIT_S) == second.result(WAIT_S) == shared.lease
        shared.yield_()


@pytest.mark.parametrize("timeout", [-1, float("nan"), "30", True])
def test_an_acquire_timeout_that_is_no_seconds_is_refused_in_one_line(
    agent: AgentRunner, timeout: Any
) -> None:
    said = rf"acquire timeout={timeout!r}: give seconds, 0 or more, or None"
    with Baton(agent.socket, ["GPU-0"], name="sync") as baton:
        with pytest.raises(InvalidRequest, match=said):
            baton.acquire(timeout=timeout)
        with pytest.raises(InvalidRequest, match=said), baton.turn(timeout=timeout):
            pass
        assert baton.lease is None

    async def scenario() -> None:
        async with AsyncBaton(agent.socket, ["GPU-0"], name="async") as baton:
            with pytest.raises(InvalidRequest, match=said):
                await baton.acquire(timeout=timeout)
            assert baton.lease is None

    asyncio.run(scenario())
    assert agent.status()["gpus"]["GPU-0"]["holder"] is None


@pytest.mark.parametrize(
    ("argument", "value"),
    [("connect_timeout", -1.0), ("connect_timeout", float("nan")), ("renew_interval", 0.0)],
)
@pytest.mark.parametrize("client", [Baton, AsyncBaton])
def test_a_client_refuses_timings_that_are_no_seconds_naming_them(
    agent: AgentRunner, client: Any, argument: str, value: float
) -> None:
    """A negative or NaN connect_timeout failed at the first acquire with the socket's own
    "Timeout value out of range"; a renew_interval of 0 was taken."""
    with pytest.raises(InvalidRequest) as refused:
        client(agent.socket, ["GPU-0"], name="t", **{argument: value})
    assert str(refused.value) == f"{argument}={value!r}: give a finite number of seconds above 0"


def test_an_infinite_acquire_timeout_waits_for_the_turn_without_end(agent: AgentRunner) -> None:
    with (
        Baton(agent.socket, ["GPU-0"], name="holder", keep_turns=False) as holder,
        Baton(agent.socket, ["GPU-0"], name="waiter") as waiter,
        ThreadPoolExecutor(1) as pool,
    ):
        holder.acquire(timeout=WAIT_S)
        mark = agent.mark()
        waiting = pool.submit(waiter.acquire, math.inf)
        agent.wait_event(lambda e: e.kind == "queued" and e.tenant_id == "local/waiter", 5, mark)
        holder.yield_()
        assert waiting.result(WAIT_S) == waiter.lease
        waiter.yield_()

    async def scenario() -> None:
        async with AsyncBaton(agent.socket, ["GPU-0"], name="async") as baton:
            await asyncio.wait_for(baton.acquire(timeout=math.inf), WAIT_S)
            await baton.yield_()

    asyncio.run(scenario())


def test_closing_while_another_thread_waits_for_a_turn_tells_it_closed(agent: AgentRunner) -> None:
    """The waiting thread was told "lost the Baton agent ...; reconnecting, retry the call", and
    the retry it asked for then said "closed": it hears "closed" at once, as `AsyncBaton`'s do."""
    with (
        Baton(agent.socket, ["GPU-0"], name="holder", keep_turns=False) as holder,
        ThreadPoolExecutor(1) as pool,
    ):
        holder.acquire(timeout=WAIT_S)
        waiter = Baton(agent.socket, ["GPU-0"], name="waiter")
        mark = agent.mark()
        waiting = pool.submit(waiter.acquire)
        agent.wait_event(lambda e: e.kind == "queued" and e.tenant_id == "local/waiter", 5, mark)
        waiter.close()
        with pytest.raises(BatonError) as told:
            waiting.result(WAIT_S)
        assert str(told.value) == "this Baton client is closed; create a new one"
        assert not isinstance(told.value, AgentUnavailable)
        agent.wait_event(lambda e: e.kind == "tenant_gone" and e.tenant_id == "local/waiter", 5)
        assert agent.status()["gpus"]["GPU-0"]["queue"] == []


def test_a_client_closed_inside_its_turn_block_leaves_the_block_quietly(
    agent: AgentRunner,
) -> None:
    """The last turn that `close()` ends (as docs/client.md's "Closing" says to leave with the
    memory on the device): the block's end raised "this Baton client is closed" as it yielded
    the turn the close had already given back."""
    baton = Baton(agent.socket, ["GPU-0"], name="sync")
    with baton.turn(timeout=WAIT_S):
        baton.close()
    agent.wait_event(lambda e: e.kind == "tenant_gone" and e.tenant_id == "local/sync", 5)

    async def scenario() -> None:
        baton = AsyncBaton(agent.socket, ["GPU-0"], name="async")
        async with baton.turn(timeout=WAIT_S):
            await baton.close()

    asyncio.run(asyncio.wait_for(scenario(), WAIT_S))
    agent.wait_event(lambda e: e.kind == "tenant_gone" and e.tenant_id == "local/async", 5)
    assert agent.status()["gpus"]["GPU-0"]["holder"] is None


def test_nested_turn_blocks_hold_the_turn_until_the_outermost_ends(agent: AgentRunner) -> None:
    """A `@baton.turn()` step called inside a `with baton.turn():` block: the step's end yielded
    the turn, and the rest of the outer block ran on the GPU with no turn, silently."""

    def holder() -> str | None:
        return agent.status()["gpus"]["GPU-0"]["holder"]

    with Baton(agent.socket, ["GPU-0"], name="sync", keep_turns=False) as baton:

        @baton.turn(timeout=WAIT_S)
        def step() -> None:
            with baton.turn(timeout=WAIT_S):
                pass

        with baton.turn(timeout=WAIT_S) as lease:
            step()
            assert baton.lease == lease and holder() == "local/sync"
        assert baton.lease is None and holder() is None

    async def scenario() -> None:
        async with AsyncBaton(agent.socket, ["GPU-0"], name="async", keep_turns=False) as baton:

            async def step() -> None:
                async with baton.turn(timeout=WAIT_S):
                    pass

            async def step_later(go: asyncio.Event) -> None:
                await go.wait()
                await step()

            go = asyncio.Event()
            async with baton.turn(timeout=WAIT_S) as lease:
                await asyncio.gather(step(), step())  # tasks inside the block: inside its turn
                assert baton.lease == lease and holder() == "local/async"
                later = asyncio.create_task(step_later(go))
            assert baton.lease is None and holder() is None
            go.set()  # a task the block started, taking its turn after the block: its own
            await later
            assert baton.lease is None and holder() is None

    asyncio.run(asyncio.wait_for(scenario(), WAIT_S))

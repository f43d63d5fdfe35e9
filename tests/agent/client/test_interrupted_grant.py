"""An acquire interrupted as its grant arrives (Ctrl-C, a signal handler raising, a cancelled
task or a timeout around it) gives the turn back, or holds it and says so: the turn is never
left held by nobody until the agent's maximum hold takes it back."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from agent.client import AsyncBaton, Baton, LeaseInfo
from agent.client.call_link import CallLink
from baton._pb import agent_pb2 as pb
from tests.harness.agent import AgentRunner

pytestmark = pytest.mark.timeout(60)
GPU = "GPU-0"
PROMPT_S = 5.0
"""How soon the other tenant must get the GPU: well inside the agent's maximum hold."""


@pytest.fixture
def agent(workdir: str) -> Iterator[AgentRunner]:
    runner = AgentRunner(workdir, max_hold=60.0).start()
    yield runner
    runner.stop()


def holder(agent: AgentRunner) -> str | None:
    return agent.status()["gpus"][GPU]["holder"]


@pytest.mark.parametrize("when", ["before it is recorded", "as it is recorded"])
def test_ctrl_c_as_the_grant_is_recorded_gives_the_turn_back(
    agent: AgentRunner, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    with Baton(agent.socket, [GPU], name="a") as a, Baton(agent.socket, [GPU], name="b") as b:
        record = a._core.granted

        def interrupted(lease: LeaseInfo, asked: object = None) -> LeaseInfo:
            monkeypatch.setattr(a._core, "granted", record)
            if when == "as it is recorded":
                record(lease, asked)  # type: ignore[arg-type]
            raise KeyboardInterrupt

        monkeypatch.setattr(a._core, "granted", interrupted)
        with pytest.raises(KeyboardInterrupt):
            a.acquire()
        assert a.lease is None and not a._core.holding()
        b.acquire(timeout=PROMPT_S)
        assert holder(agent) == "local/b"
        b.yield_()
        assert a.acquire(timeout=PROMPT_S).gpus == (GPU,)  # the client goes on as before
        a.yield_()


@pytest.mark.parametrize("timeout", [None, 30.0])
def test_an_acquire_cancelled_as_its_grant_arrives_gives_the_turn_back_or_holds_it(
    agent: AgentRunner, timeout: float | None
) -> None:
    async def scenario() -> None:
        async with (
            AsyncBaton(agent.socket, [GPU], name="a") as a,
            AsyncBaton(agent.socket, [GPU], name="b") as b,
        ):
            deliver = a._on_reply
            acquiring: asyncio.Task[LeaseInfo] | None = None

            def cancel_on_grant(reply: pb.Reply) -> None:
                deliver(reply)  # matched to the waiting acquire, which is then cancelled
                if reply.HasField("lease") and acquiring is not None:
                    acquiring.cancel()

            a._on_reply = cancel_on_grant  # type: ignore[method-assign]
            acquiring = asyncio.create_task(a.acquire(timeout))
            try:
                lease = await acquiring
            except asyncio.CancelledError:
                assert a.lease is None and not a._core.holding()
            else:  # the cancellation came too late to stop it (wait_for on Python 3.11)
                assert a.lease == lease and holder(agent) == "local/a"
                await a.yield_()
            a._on_reply = deliver  # type: ignore[method-assign]
            await asyncio.wait_for(b.acquire(), PROMPT_S)
            assert holder(agent) == "local/b"
            assert a.lease is None

    asyncio.run(scenario())


@pytest.mark.parametrize("when", ["before the yield leaves", "as the yield leaves"])
def test_a_second_ctrl_c_in_the_yield_of_an_interrupted_turn_still_ends_the_turn(
    agent: AgentRunner, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    with Baton(agent.socket, [GPU], name="a", keep_turns=False) as a:
        send = CallLink.send

        def second_ctrl_c(link: CallLink, message: pb.ClientMessage) -> None:
            if message.request.WhichOneof("kind") != "release":
                return send(link, message)
            monkeypatch.setattr(CallLink, "send", send)
            if when == "as the yield leaves":
                send(link, message)
            raise KeyboardInterrupt("the second")

        with pytest.raises(KeyboardInterrupt, match="the second"), a.turn():
            monkeypatch.setattr(CallLink, "send", second_ctrl_c)
            raise KeyboardInterrupt("the first")
        assert a.lease is None and not a._core.holding()
        with Baton(agent.socket, [GPU], name="b") as b:
            b.acquire(timeout=PROMPT_S)
            assert holder(agent) == "local/b"
            b.yield_()
        assert a.acquire(timeout=PROMPT_S).gpus == (GPU,)  # not "already holds"
        a.yield_()


def test_a_second_cancel_in_the_yield_of_a_cancelled_turn_still_ends_the_turn(
    agent: AgentRunner,
) -> None:
    async def scenario() -> None:
        async with (
            AsyncBaton(agent.socket, [GPU], name="a", keep_turns=False) as a,
            AsyncBaton(agent.socket, [GPU], name="b") as b,
        ):
            entered, held = asyncio.Event(), asyncio.Event()
            send = a._send

            async def first_yield_held(message: pb.ClientMessage) -> None:
                if message.request.HasField("release") and not held.is_set():
                    held.set()  # as if another write held the lock: not written until then
                    await asyncio.Event().wait()
                await send(message)

            async def job() -> None:
                async with a.turn():
                    entered.set()
                    await asyncio.Event().wait()  # until cancelled

            a._send = first_yield_held  # type: ignore[method-assign]
            task = asyncio.create_task(job())
            await asyncio.wait_for(entered.wait(), PROMPT_S)
            task.cancel()  # the first cancel ends the body; the turn's exit yields
            await asyncio.wait_for(held.wait(), PROMPT_S)
            task.cancel()  # the second lands as the yield waits to be written
            with pytest.raises(asyncio.CancelledError):
                await task
            assert a.lease is None and not a._core.holding()
            await asyncio.wait_for(b.acquire(), PROMPT_S)
            assert holder(agent) == "local/b"
            await b.yield_()
            await asyncio.wait_for(a.acquire(), PROMPT_S)  # not "already holds"
            await a.yield_()

    asyncio.run(scenario())

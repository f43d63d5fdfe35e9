"""The client library: the two calls, context managers and decorators, errors, env defaults."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from agent.client import AgentUnavailable, AsyncBaton, Baton, NotHolding
from tests.harness.agent import AgentRunner


def test_sync_turn_as_context_manager_and_decorator(agent: AgentRunner) -> None:
    with Baton(agent.socket, "GPU-0,GPU-1", name="sync") as baton:
        with baton.turn() as lease:
            assert lease.gpus == ("GPU-0", "GPU-1")
            assert agent.status()["gpus"]["GPU-1"]["holder"] == "local/sync"
        assert baton.lease is None

        @baton.turn()
        def step(x: int) -> int:
            assert baton.lease is not None
            return x * 2

        assert step(21) == 42 and step(1) == 2
        assert agent.status()["gpus"]["GPU-0"]["fencing_token"] == 3
        with pytest.raises(NotHolding):
            baton.yield_()


def test_async_client_turns_and_cancellation(agent: AgentRunner) -> None:
    async def scenario() -> None:
        async with (
            AsyncBaton(agent.socket, ["GPU-0"], name="x") as x,
            AsyncBaton(agent.socket, ["GPU-0"], name="y") as y,
        ):
            async with x.turn() as lease:
                assert lease.fencing_tokens == {"GPU-0": 1}
                mark = await asyncio.to_thread(agent.mark)
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(y.acquire(), 0.2)
                await asyncio.to_thread(agent.wait_event, lambda e: e.kind == "cancelled", 5, mark)
                assert agent.status()["gpus"]["GPU-0"]["queue"] == []

            @y.turn()
            async def step() -> str:
                assert y.lease is not None
                return y.lease.lease_id

            assert await step() != lease.lease_id

    asyncio.run(scenario())


def test_environment_supplies_socket_and_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATON_AGENT_SOCKET", "/tmp/elsewhere.sock")
    monkeypatch.setenv("BATON_GPUS", "GPU-a, GPU-b")
    baton = AsyncBaton()
    assert baton.socket == "/tmp/elsewhere.sock" and baton.gpus == ("GPU-a", "GPU-b")


def test_a_container_naming_two_claims_has_each_claims_gpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The runtime keeps one claim's BATON_GPUS (tests/k8s/dra, the real containerd): each
    claim's device variables name the others."""
    monkeypatch.setenv("BATON_GPUS", "GPU-b")
    monkeypatch.setenv("BATON_CLAIM_GPU_1", "GPU-b")
    monkeypatch.setenv("BATON_CLAIM_GPU_0", "GPU-a")
    assert AsyncBaton().gpus == ("GPU-b", "GPU-a")
    assert AsyncBaton(gpus="GPU-c").gpus == ("GPU-c",)  # given: only what is given


def test_no_agent_is_a_clear_error_not_a_hang(workdir: str) -> None:
    baton = Baton(f"{workdir}/missing.sock", ["GPU-0"], connect_timeout=1)
    started = time.monotonic()
    with pytest.raises(AgentUnavailable, match=r"missing\.sock"):
        baton.acquire()
    assert time.monotonic() - started < 5
    baton.close()


def test_calls_while_the_agent_is_gone_raise(workdir: str) -> None:
    runner = AgentRunner(workdir).start()
    baton = Baton(runner.socket, ["GPU-0"], name="orphan", connect_timeout=0.5)
    try:
        baton.acquire()
        runner.stop()
        with pytest.raises(AgentUnavailable, match=r"reconnecting|lost"):
            baton.yield_()
        with pytest.raises(AgentUnavailable, match="reconnecting"):
            baton.yield_()  # the turn is kept for a retry; still no agent to end it
    finally:
        baton.close()
        runner.stop()


def test_background_renewal_notices_a_lost_lease(agent: AgentRunner) -> None:
    lost = threading.Event()

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "lost" in record.getMessage():
                lost.set()

    handler = Watch()
    logging.getLogger("baton.client").addHandler(handler)
    try:
        with Baton(agent.socket, ["GPU-0"], name="renewing", renew_interval=0.05) as baton:
            lease = baton.acquire()
            agent.inspect(lambda service: service.table.release(lease.lease_id))
            assert lost.wait(5)
            assert baton.lease is None
    finally:
        logging.getLogger("baton.client").removeHandler(handler)

"""Clients of a test agent whose turns are revoked and given back: the helpers the resume tests
share (`test_resume_restart`, `test_resume_acquire`, `test_resume_live`)."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable
from typing import Any

from agent.client import AgentUnavailable, AsyncBaton, Baton
from tests.harness.agent import AgentRunner

Client = Baton | AsyncBaton


def client(kind: str, socket: str, name: str) -> Client:
    if kind == "blocking":
        return Baton(socket, ["GPU-0"], name=name, connect_timeout=5)
    return AsyncBaton(socket, ["GPU-0"], name=name, connect_timeout=5)


async def call(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a client's method from the test's loop (a blocking one on a thread)."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    return await asyncio.to_thread(fn, *args)


async def until(check: Callable[[], bool], what: str, within: float = 10) -> None:
    """Wait (`within` seconds at most) for `check`; `what` names it if it never comes."""
    deadline = asyncio.get_running_loop().time() + within
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"not within {within} s: {what}"
        await asyncio.sleep(0.01)


def gate_reconnects(tenant: Client) -> threading.Event:
    """The client's reconnects fail (as if the agent were not there yet) until the returned
    event is set."""
    gate = threading.Event()

    def shut() -> None:
        if not gate.is_set():
            raise AgentUnavailable("held back by the test")

    if isinstance(tenant, AsyncBaton):
        opens = tenant._open

        async def gated_async() -> None:
            shut()
            await opens()

        tenant._open = gated_async  # type: ignore[method-assign]
    else:
        open_ = tenant._open

        def gated() -> Any:
            shut()
            return open_()

        tenant._open = gated  # type: ignore[method-assign]
    return gate


def queue(agent: AgentRunner) -> list[tuple[str, bool]]:
    waiting = agent.status()["gpus"]["GPU-0"]["queue"]
    return [(w["tenant_id"], w["resuming"]) for w in waiting]


def holder(agent: AgentRunner) -> str | None:
    return agent.status()["gpus"]["GPU-0"]["holder"]

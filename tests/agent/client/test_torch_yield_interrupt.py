"""A Ctrl-C that lands as `TorchParker` finishes the park `yield_` runs at the end of a turn: the
park is done and the parker counts it, so the client must count it too. It did not (the
interrupt left the callback before the client noted what it moved): the agent's park for the
next tenant then hit `ParkError: already parked`, and the tenant's next grant brought nothing
back, its tensors parked for good."""

from __future__ import annotations

import importlib.util
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from agent.client import Baton
from agent.core.events import QUEUED
from tests.agent.client.test_client_close import GPU, WAIT_S
from tests.agent.client.test_park_at_yield import app_agent, hints_of
from tests.agent.client.test_restore_with_grant import Recorded, taking
from tests.harness.agent import AgentRunner

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch"),
]
__all__ = ["app_agent"]  # the fixture


@pytest.fixture
def python_ctrl_c() -> Iterator[None]:
    """Python's own Ctrl-C handler, whatever this process was started with (a shell's
    background job starts with SIGINT ignored, and nothing would be raised)."""
    started_with = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, started_with)


def test_a_ctrl_c_as_the_park_at_the_yield_ends_is_counted_by_the_client(
    app_agent: AgentRunner, monkeypatch: pytest.MonkeyPatch, python_ctrl_c: None
) -> None:
    import torch

    import agent.client.torch as parking
    from agent.client.torch import TorchParker

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    parker = TorchParker(model)
    other = Recorded()
    a = Baton(
        app_agent.socket, [GPU], name="a", gpu_memory_mib=60,
        on_park=parker.park, on_restore=parker.restore, park_at_yield=True,
    )  # fmt: skip
    b = Baton(
        app_agent.socket, [GPU], name="b", gpu_memory_mib=60,
        on_park=other.park, on_restore=other.restore,
    )  # fmt: skip
    guard = parking.guard

    def interrupted(tensors: Any) -> Any:  # a Ctrl-C lands as the park frees the storages
        os.kill(os.getpid(), signal.SIGINT)
        return guard(tensors)

    with a, b:
        hints = hints_of(a)
        a.acquire(WAIT_S)
        taker = taking(app_agent, b, lambda: b.acquire(WAIT_S))
        hints.wait((GPU,))
        monkeypatch.setattr(parking, "guard", interrupted)
        with pytest.raises(KeyboardInterrupt):
            a.yield_()
        monkeypatch.setattr(parking, "guard", guard)
        assert parker.parked and a.lease is None
        size = sum(v.numel() * v.element_size() for v in before.values())
        assert a._callbacks_run.parked.copy() == {GPU: size}  # the client counts the park
        taker.join(WAIT_S)
        assert not taker.is_alive() and b.lease is not None, "b never got a's room"
        b.yield_()
        a.acquire(WAIT_S)  # a restores what it parked with its grant
        assert not parker.parked
        with parker.in_use():
            after = model.state_dict()
            assert all(torch.equal(after[k], v) for k, v in before.items())
        a.yield_()


def test_a_ctrl_c_as_the_restore_a_grant_owes_returns_leaves_the_next_turn_usable(
    app_agent: AgentRunner, python_ctrl_c: None
) -> None:
    """A Ctrl-C landing after `TorchParker.restore` returned, before the client noted the
    restore: the parker counted it done, the client still counted the GPU parked, so every
    later acquire ran the restore again, got `ParkError: not parked` and gave its turn back,
    and the agent was told the tenant's (resident) memory was parked."""
    import torch

    from agent.client.torch import TorchParker

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    parker = TorchParker(model)
    interrupt = threading.Event()

    def restore(gpu: str) -> int:
        moved = parker.restore(gpu)
        if interrupt.is_set():  # a Ctrl-C lands as the restore returns
            interrupt.clear()
            os.kill(os.getpid(), signal.SIGINT)
        return moved

    a = Baton(
        app_agent.socket, [GPU], name="a", gpu_memory_mib=60,
        on_park=parker.park, on_restore=restore,
    )  # fmt: skip
    other = Recorded()
    b = Baton(
        app_agent.socket, [GPU], name="b", gpu_memory_mib=60,
        on_park=other.park, on_restore=other.restore,
    )  # fmt: skip
    with a, b:
        a.acquire(WAIT_S)
        taker = taking(app_agent, b, lambda: b.acquire(WAIT_S))
        a.yield_()  # the agent parks a for b
        taker.join(WAIT_S)
        assert not taker.is_alive() and b.lease is not None and parker.parked
        assert a.tenant is not None
        tenant_id = a.tenant.tenant_id
        since = app_agent.mark()

        def yield_once_a_waits() -> None:
            queued = lambda e: e.kind == QUEUED and e.tenant_id == tenant_id  # noqa: E731
            app_agent.wait_event(queued, WAIT_S, since)
            b.yield_()

        yielder = threading.Thread(target=yield_once_a_waits, name="yielder")
        yielder.start()
        interrupt.set()
        with pytest.raises(KeyboardInterrupt):
            a.acquire(WAIT_S)  # a restores itself with its grant, on this thread
        yielder.join(WAIT_S)
        assert not yielder.is_alive() and not parker.parked and a.lease is None
        assert a._callbacks_run.parked.copy() == {}  # the client counts the restore
        residency = app_agent.status()["residency"]["tenants"][tenant_id]["residency"]
        assert residency == "resident"
        a.acquire(WAIT_S)  # the next turn is usable
        with parker.in_use():
            after = model.state_dict()
            assert all(torch.equal(after[k], v) for k, v in before.items())
        a.yield_()

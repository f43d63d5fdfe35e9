"""`TorchParker.in_use()` on the thread that also takes the turns: nested, or around a turn
whose yield parks (the agent's `ParkAtYield`). Either waited on its own lock for ever."""

from __future__ import annotations

import importlib.util
import logging
import threading

import pytest

from agent.client import Baton
from tests.agent.client.test_client_close import GPU, WAIT_S, app_agent
from tests.agent.client.test_park_at_yield import hints_of
from tests.agent.client.test_restore_with_grant import taking
from tests.harness.agent import AgentRunner

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch"),
]
__all__ = ["app_agent"]  # the fixture, used by name


def ends(work: object, name: str) -> threading.Thread:
    """`work` run on a daemon thread, joined for WAIT_S: a hang fails the test, not the run."""
    thread = threading.Thread(target=work, name=name, daemon=True)  # type: ignore[arg-type]
    thread.start()
    thread.join(WAIT_S)
    assert not thread.is_alive(), f"{name} never ended"
    return thread


def test_in_use_nested_on_one_thread_holds_parks_off_until_the_outer_block_ends() -> None:
    import torch

    from agent.client.torch import TorchParker

    parker = TorchParker(torch.nn.Linear(4, 4))
    held: list[bool] = []

    def nested() -> None:
        with parker.in_use():
            with parker.in_use():
                held.append(parker._lock.locked())
            held.append(parker._lock.locked())  # the outer block still holds parks off
        held.append(parker._lock.locked())

    ends(nested, "nested")
    assert held == [True, True, False]
    assert parker.park("gpu") == 80 and parker.parked


def test_a_turn_taken_inside_in_use_parks_after_the_block_instead_of_hanging_at_its_yield(
    app_agent: AgentRunner, caplog: pytest.LogCaptureFixture
) -> None:
    """The yield parks on the thread inside `in_use()`: that park says why it cannot run there
    and is left to the agent's callback, which parks once the block ends."""
    import torch

    from agent.client.torch import TorchParker

    parker = TorchParker(torch.nn.Linear(64, 64))
    a = Baton(
        app_agent.socket, [GPU], name="a", gpu_memory_mib=60,
        on_park=parker.park, on_restore=parker.restore,
    )  # fmt: skip
    b = Baton(app_agent.socket, [GPU], name="b", gpu_memory_mib=60, on_park=lambda gpu: 0)
    hints = hints_of(a)
    taken: list[threading.Thread] = []

    def swapped() -> None:
        with parker.in_use(), a.turn(WAIT_S):  # the turn inside in_use(): its yield parks
            taken.append(taking(app_agent, b, lambda: b.acquire(WAIT_S)))
            hints.wait((GPU,))

    try:
        with caplog.at_level(logging.WARNING, logger="baton.client"):
            ends(swapped, "swapped")
        taken[0].join(WAIT_S)
        assert b.lease is not None, "b was never granted"
        assert parker.parked and parker.stats.parks == 1
        said = [r.getMessage() for r in caplog.records if "on_park" in r.getMessage()]
        assert said and "park asked inside parker.in_use() on the same thread" in said[0]
    finally:
        a.close()
        b.close()

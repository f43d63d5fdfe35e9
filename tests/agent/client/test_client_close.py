"""Closing a blocking client while the agent has it park or restore: the callback finishes and is
answered first (bounded, with a clear message if it never ends); later ones are refused."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

import pytest

from agent.client import Baton
from agent.client.callback_runner import CallbackRunner
from agent.parking.setup import ParkingOptions
from baton._pb import agent_pb2 as pb
from baton.contract.names import MIB, fake_gpu_uuid
from tests.harness.agent import AgentRunner

pytestmark = pytest.mark.timeout(60)
GPU = fake_gpu_uuid(0)
WAIT_S = 20.0
"""Bound on every wait for something the test itself set going."""


@pytest.fixture
def app_agent(workdir: str) -> Iterator[AgentRunner]:
    """An agent whose 100 MiB GPU holds one 60 MiB tenant at a time: every switch parks."""
    with AgentRunner(workdir, parking=ParkingOptions(backend="app", fake_gpus="1x100")) as runner:
        yield runner


class HeldCallbacks:
    """on_park/on_restore that signal when they start and return only when released."""

    def __init__(self) -> None:
        self.started = {"park": threading.Event(), "restore": threading.Event()}
        self.release = threading.Event()
        self.order: list[str] = []

    def call(self, action: str) -> int:
        self.started[action].set()
        assert self.release.wait(WAIT_S), "the test never released the callback"
        self.order.append(f"{action} finished")
        return 60 * MIB

    def park(self, gpu: str) -> int:
        return self.call("park")

    def restore(self, gpu: str) -> int:
        return self.call("restore")


def tenant(agent: AgentRunner, name: str, held: HeldCallbacks | None = None) -> Baton:
    quick = HeldCallbacks()
    quick.release.set()
    callbacks = held or quick
    return Baton(
        agent.socket, [GPU], name=name, gpu_memory_mib=60,
        on_park=callbacks.park, on_restore=callbacks.restore, park_at_yield=False,
    )  # fmt: skip


def moved(agent: AgentRunner, direction: str) -> float:
    registry = agent.agent.parking.metrics.registry  # type: ignore[union-attr]
    labels = {"backend": "app", "direction": direction}
    return registry.get_sample_value("baton_moved_bytes_total", labels) or 0.0


def closing(client: Baton, held: HeldCallbacks) -> threading.Thread:
    """Close `client` on a thread of its own; `held.order` records when that returned."""

    def close() -> None:
        client.close()
        held.order.append("closed")

    thread = threading.Thread(target=close)
    thread.start()
    return thread


def test_close_during_a_park_waits_for_it_and_answers_the_agent(app_agent: AgentRunner) -> None:
    held = HeldCallbacks()
    leaving, staying = tenant(app_agent, "leaving", held), tenant(app_agent, "staying")
    try:
        with leaving.turn(timeout=WAIT_S):
            pass
        taking = threading.Thread(target=staying.acquire, args=(WAIT_S,))
        taking.start()  # it needs the room: the agent parks `leaving`
        assert held.started["park"].wait(WAIT_S)
        closer = closing(leaving, held)
        closer.join(0.5)  # bounded: close must still be waiting for the park
        held.release.set()
        closer.join(WAIT_S)
        taking.join(WAIT_S)
        assert held.order == ["park finished", "closed"]
        assert staying.lease is not None
        assert moved(app_agent, "park") == 60 * MIB  # the answer left before the session ended
    finally:
        held.release.set()
        leaving.close()
        staying.close()


def test_close_during_a_restore_waits_for_it(app_agent: AgentRunner) -> None:
    held = HeldCallbacks()
    holder, returning = tenant(app_agent, "holder"), tenant(app_agent, "returning", held)
    try:
        with returning.turn(timeout=WAIT_S):
            pass
        held.release.set()  # its park goes through...
        holder.acquire(WAIT_S)
        assert held.order == ["park finished"]
        held.release = threading.Event()  # ...its restore will not, until released
        asking = threading.Thread(target=_acquire_quietly, args=(returning,))
        asking.start()
        holder.yield_()  # the agent restores `returning`, whose restore now hangs
        assert held.started["restore"].wait(WAIT_S)
        closer = closing(returning, held)
        closer.join(0.5)
        held.release.set()
        closer.join(WAIT_S)
        asking.join(WAIT_S)
        assert held.order == ["park finished", "restore finished", "closed"]
    finally:
        held.release.set()
        holder.close()
        returning.close()


def _acquire_quietly(client: Baton) -> None:
    """An acquire the test ends by closing the client: whatever it raises is expected."""
    with contextlib.suppress(Exception):  # the client closed under it
        client.acquire(WAIT_S)


def test_a_callback_that_never_ends_bounds_close_and_says_so(
    app_agent: AgentRunner, caplog: pytest.LogCaptureFixture
) -> None:
    held = HeldCallbacks()
    leaving, staying = tenant(app_agent, "stuck", held), tenant(app_agent, "staying")
    leaving.close_wait = 0.2
    try:
        with leaving.turn(timeout=WAIT_S):
            pass
        taking = threading.Thread(target=_acquire_quietly, args=(staying,))
        taking.start()
        assert held.started["park"].wait(WAIT_S)
        with caplog.at_level(logging.ERROR, logger="baton.client"):
            leaving.close()
        assert "on_park(" in caplog.text and "still runs" in caplog.text
        assert held.order == []
    finally:
        held.release.set()
        staying.close()


def test_callbacks_are_answered_with_their_timings_and_refused_once_closed() -> None:
    answers: list[pb.CallbackResult] = []
    runner = CallbackRunner({"park": lambda gpu: 1, "restore": lambda gpu: 2}, answers.append)
    runner.run(pb.Callback(call_id="1", action="park", gpu="a"))
    runner.run(pb.Callback(call_id="2", action="restore", gpu="a"))
    assert runner.close(WAIT_S)
    runner.run(pb.Callback(call_id="3", action="park", gpu="a"))
    assert [(a.call_id, a.bytes, a.error) for a in answers[:2]] == [("1", 1, ""), ("2", 2, "")]
    assert answers[2].call_id == "3" and "closing" in answers[2].error
    assert [(t.action, t.moved) for t in runner.timings] == [("park", 1), ("restore", 2)]
    assert all(t.received <= t.started <= t.finished <= t.answered for t in runner.timings)

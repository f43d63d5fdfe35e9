"""A GPU kept for an owed yielder on a real agent: it ends the moment the yielder's session
ends, and by the window's timer when the yielder stays away; the waiter is then granted."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import pytest

from agent.client import Baton
from agent.client.errors import BatonError
from agent.core import events as ev
from agent.core.fair import FairConfig
from tests.harness.agent import AgentRunner

GPU = "GPU-0"
pytestmark = pytest.mark.timeout(60)


class Waiting:
    """A tenant's acquire in a thread: when its grant came."""

    def __init__(self, runner: AgentRunner, baton: Baton) -> None:
        mark = runner.mark()
        self.granted_at: float | None = None
        self._thread = threading.Thread(target=self._acquire, args=(baton,), daemon=True)
        self._thread.start()
        queued = f"local/{baton.name}"
        runner.wait_event(lambda e: e.kind == ev.QUEUED and e.tenant_id == queued, since=mark)

    def _acquire(self, baton: Baton) -> None:
        with contextlib.suppress(BatonError):  # the test ended first: `join` says so
            baton.acquire(timeout=30)
            self.granted_at = time.monotonic()

    def join(self, timeout: float) -> float:
        self._thread.join(timeout)
        assert self.granted_at is not None, "never granted"
        return self.granted_at


@pytest.fixture
def owed_yielder(
    workdir: str, request: pytest.FixtureRequest
) -> Iterator[tuple[AgentRunner, Baton, Waiting]]:
    """Tenant "a" (duty 90) just yielded, owed more than the window (the param) is worth, and
    the GPU is kept for it; "b" (duty 10) waits."""
    window = request.param
    runner = AgentRunner(workdir, queue_policy="fair", fair=FairConfig(anticipate_s=window)).start()
    a = Baton(runner.socket, [GPU], name="a", gpu_duty=90, keep_turns=False)  # the agent's hold
    b = Baton(runner.socket, [GPU], name="b", gpu_duty=10)
    try:
        b.acquire(timeout=10)
        a_waits = Waiting(runner, a)  # "a" joins level with "b"'s turn
        time.sleep(window / 5)  # "b"'s step: by its duty, it is ahead of "a" by twice the window
        b.yield_()
        a_waits.join(10)
        b_waits = Waiting(runner, b)
        a.yield_()
        kept = runner.inspect(lambda s: s.table.anticipation.holds.get(GPU))
        assert kept is not None and kept.tenant_id == "local/a"
        yield runner, a, b_waits
    finally:
        a.close()
        b.close()
        runner.stop()


@pytest.mark.parametrize("owed_yielder", [5.0], indirect=True)
def test_a_yielder_that_leaves_frees_the_gpu_at_once(
    owed_yielder: tuple[AgentRunner, Baton, Waiting],
) -> None:
    runner, a, b_waits = owed_yielder
    [waiter] = runner.status()["gpus"][GPU]["queue"]
    assert "local/a (owed, kept for it" in waiter["why"], waiter["why"]
    left = time.monotonic()
    a.close()
    assert b_waits.join(10) - left < 2.0  # not the 5 s window


@pytest.mark.parametrize("owed_yielder", [0.5], indirect=True)
def test_a_yielder_that_stays_away_keeps_the_gpu_for_the_window_only(
    owed_yielder: tuple[AgentRunner, Baton, Waiting],
) -> None:
    runner, _, b_waits = owed_yielder
    yielded = time.monotonic()
    assert b_waits.join(10) - yielded < 0.5 + 2.0
    status = runner.inspect(lambda s: s.table.anticipation.holds)
    assert status == {}

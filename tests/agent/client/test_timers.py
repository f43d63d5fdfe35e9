"""The clients' timers: the blocking client's keeper thread and the asyncio client's loop timer
fire once their deadline has come, follow a deadline that moves, and stop when closed."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from agent.client.timers import Keeper, LoopTimer

pytestmark = pytest.mark.timeout(30)


def test_the_keeper_gives_back_once_the_deadline_passes_and_follows_it() -> None:
    deadline: list[float | None] = [None]
    fired: list[float] = []
    gave_back = threading.Event()

    def give_back() -> None:  # the client's: a no-op unless a kept lease is due
        if deadline[0] is not None and time.monotonic() >= deadline[0]:
            fired.append(time.monotonic())
            deadline[0] = None
            gave_back.set()

    keeper = Keeper(lambda: deadline[0], give_back)
    try:
        deadline[0] = time.monotonic() + 60  # a far deadline first...
        keeper.poke()
        kept = time.monotonic()
        deadline[0] = kept + 0.05  # ...then a near one: the keeper looks again when poked
        keeper.poke()
        assert gave_back.wait(10)
        assert fired[0] - kept >= 0.05
    finally:
        keeper.close()
    assert keeper._thread is not None and not keeper._thread.is_alive()


def test_a_keeper_never_poked_starts_no_thread() -> None:
    keeper = Keeper(lambda: None, lambda: None)
    keeper.close()
    assert keeper._thread is None


def test_the_loop_timer_fires_at_the_last_time_set() -> None:
    async def run() -> float:
        loop = asyncio.get_running_loop()
        fired = loop.create_future()
        timer = LoopTimer(lambda: fired.set_result(loop.time()), loop.time)
        timer.set(loop.time() + 60)
        start = loop.time()
        timer.set(start + 0.05)  # moved earlier
        at = await asyncio.wait_for(fired, 10)
        timer.set(None)
        return at - start

    assert asyncio.run(run()) >= 0.049  # (the loop may run a timer a clock tick early)

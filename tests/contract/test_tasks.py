"""`baton.contract.tasks.to_the_end`: a wait that repeated cancels do not cut short."""

from __future__ import annotations

import asyncio

import pytest

from baton.contract.tasks import to_the_end


def test_a_wait_cancelled_twice_still_lasts_until_every_task_has_ended() -> None:
    async def body() -> None:
        gate = asyncio.Event()
        first = asyncio.ensure_future(gate.wait())
        second = asyncio.ensure_future(asyncio.sleep(0))
        ended: list[bool] = []

        async def clean_up() -> None:
            await to_the_end(first, second)
            ended.append(first.done() and second.done())

        waiting = asyncio.ensure_future(clean_up())
        for _ in range(2):  # a timeout, then a shutdown
            await asyncio.sleep(0)
            waiting.cancel()
        await asyncio.sleep(0)
        assert not waiting.done() and not ended  # still waiting for `first`
        gate.set()
        await asyncio.wait_for(waiting, 5)  # ends normally: the cancels went into the wait
        assert ended == [True]

    asyncio.run(body())


def test_tasks_that_ended_already_are_not_waited_for_and_their_outcome_is_left() -> None:
    async def body() -> None:
        done = asyncio.ensure_future(asyncio.sleep(0, result=1))
        await done
        broken = asyncio.get_running_loop().create_future()
        broken.set_exception(RuntimeError("kept for the caller"))
        await to_the_end(done, broken)
        with pytest.raises(RuntimeError, match="kept for the caller"):
            broken.result()

    asyncio.run(body())

"""A plan's blocking moves and the read after them cross to a worker thread once."""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from agent.parking.backends.base import BackendError

from .conftest import GPU
from .test_fast_grant import grant, preparer, residency

WAIT_S = 10.0


class CountingPool(ThreadPoolExecutor):
    """The event loop's default executor, counting the calls handed to it."""

    def __init__(self) -> None:
        super().__init__(max_workers=2)
        self.calls = 0
        self.futures: list[Future] = []

    def submit(self, fn, /, *args, **kwargs):
        self.calls += 1
        self.futures.append(super().submit(fn, *args, **kwargs))
        return self.futures[-1]


class Moving:
    """A fake backend whose parks may fail once or wait for the test; counts the moves."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self.fail_parks = 0
        self.hold_park: threading.Event | None = None
        self.fail_held = False
        """Whether a park held (`hold_park`) fails once let go."""
        self.parking = threading.Event()
        self.made: list[tuple[str, str]] = []

    def park(self, tenant_id: str, gpu: str):
        if self.fail_parks:
            self.fail_parks -= 1
            raise BackendError(f"{tenant_id}: the copy failed")
        self.parking.set()
        if self.hold_park is not None:
            assert self.hold_park.wait(WAIT_S)
            if self.fail_held:
                raise BackendError(f"{tenant_id}: the copy failed as it ended")
        self.made.append(("park", tenant_id))
        return self.backend.park(tenant_id, gpu)

    def restore(self, tenant_id: str, gpu: str):
        self.made.append(("restore", tenant_id))
        return self.backend.restore(tenant_id, gpu)

    def __getattr__(self, name: str):
        return getattr(self.backend, name)


def handover(backend, body):
    """Tenants a and b of 60 MiB on a 100 MiB GPU, b resident (a parked for it); `body(prep,
    moving, pool)` runs with every worker-thread call counted from then on."""
    moving = Moving(backend)
    prep, counting, _ = preparer(moving, ("a", 60), ("b", 60))
    assert residency(prep) == {"a": "parked", "b": "resident"}

    async def main() -> None:
        pool = CountingPool()
        asyncio.get_running_loop().set_default_executor(pool)
        try:
            await body(prep, moving, pool)
        finally:
            pool.shutdown(wait=True)

    asyncio.run(asyncio.wait_for(main(), WAIT_S))
    return prep, moving, counting


def test_a_handover_parks_restores_and_reads_the_moved_in_one_worker_thread_call(backend):
    async def body(prep, moving, pool):
        await grant(prep, "a")  # b parked, a restored, both read again: one call
        assert pool.calls == 1

    prep, moving, _ = handover(backend, body)
    assert moving.made[-2:] == [("park", "b"), ("restore", "a")]
    assert residency(prep) == {"a": "resident", "b": "parked"}
    assert not a_full_read_corrects(prep)  # the model took the moved tenants' read in


def a_full_read_corrects(prep) -> bool:
    """Whether a full read of the node now finds the model wrong anywhere."""
    before = residency(prep)
    asyncio.run(asyncio.wait_for(prep.refresh(), WAIT_S))
    return residency(prep) != before


def test_a_move_that_fails_in_the_worker_thread_is_retried_and_the_rest_made(backend):
    async def body(prep, moving, pool):
        moving.fail_parks = 1
        await grant(prep, "a")

    prep, moving, _ = handover(backend, body)
    assert moving.made[-2:] == [("park", "b"), ("restore", "a")]
    assert residency(prep) == {"a": "resident", "b": "parked"}
    failures = prep.metrics.move_failures.labels("fake", "park")._value.get()
    assert failures == 1


@pytest.mark.parametrize("retried", [False, True], ids=["first-try", "retried"])
def test_a_cancelled_handover_ends_with_the_move_under_way_and_reads_where_it_left_the_tenant(
    backend, retried
):
    """Cancelled (the agent stopping) while b's park runs in a worker thread (in the plan's
    call, or retried on its own): a's restore is not made, and the preparation gives up the node
    only once b's park has ended, its read (the model, the parked record saved) finding b
    parked, as the backend has it."""

    async def body(prep, moving, pool):
        moving.fail_parks = int(retried)
        await cancel_during_a_park(prep, moving, pool)

    prep, moving, _ = handover(backend, body)
    assert moving.made[-1] == ("park", "b")
    assert ("restore", "a") not in moving.made[-2:]
    assert residency(prep) == {"a": "parked", "b": "parked"}
    assert not a_full_read_corrects(prep)


async def cancel_during_a_park(prep, moving, pool) -> None:
    """Grant a, cancel the grant while b's park runs in a worker thread, then let that park
    end; the grant is cancelled."""
    moving.hold_park = threading.Event()
    moving.parking.clear()
    task = asyncio.ensure_future(prep.prepare("a", [GPU]))
    assert await asyncio.to_thread(moving.parking.wait, WAIT_S)
    task.cancel()
    since = len(pool.futures)
    await asyncio.to_thread(lambda: None)  # the task takes its cancel meanwhile
    for handed in pool.futures[since:]:  # what it handed to a thread then (a read) ends
        await asyncio.wrap_future(handed)
    moving.hold_park.set()  # the park under way ends; the thread makes no restore after it
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()


@pytest.mark.parametrize("retried", [False, True], ids=["first-try", "retried"])
def test_a_move_failing_as_its_plan_is_cancelled_is_counted_and_logged(backend, caplog, retried):
    """b's park, under way in a worker thread (in the plan's call, or retried on its own) as
    the agent stops, fails as it ends: counted in baton_move_failures and logged naming b, its
    GPU and the error, as any failed move is (it was neither), and b read where it stayed."""

    async def body(prep, moving, pool):
        moving.fail_parks = int(retried)
        moving.fail_held = True
        await cancel_during_a_park(prep, moving, pool)

    caplog.set_level(logging.WARNING)
    prep, _, _ = handover(backend, body)
    failures = prep.metrics.move_failures.labels("fake", "park")._value.get()
    assert failures == 1 + int(retried)
    assert (
        f"park of b on {GPU} failed as its plan was cancelled (not tried again): b: the copy "
        "failed as it ended"
    ) in caplog.messages
    assert residency(prep) == {"a": "parked", "b": "resident"}
    assert not a_full_read_corrects(prep)


def test_a_handed_grant_whose_method_restores_the_tenant_itself_still_crosses_once(backend):
    """The tenant's client restores with its grant (`restores_with_grant`), but its method
    restores it itself (`hand_restore` refuses): its restore is made with b's park and the
    read in one worker-thread call, not in three (the park, the restore, the read)."""

    async def body(prep, moving, pool):
        await prep.prepare("a", [GPU], handed=True)
        assert pool.calls == 1

    prep, moving, _ = handover(backend, body)
    assert moving.made[-2:] == [("park", "b"), ("restore", "a")]
    assert residency(prep) == {"a": "resident", "b": "parked"}
    assert not a_full_read_corrects(prep)

"""A restore the agent gave up on (its callback ran past the timeout) that then finished is not
run again when the agent retries it: the tenant's memory is back already, and a second
on_restore would restore it over itself (or fail on memory that is not parked)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator

import pytest

from agent.client import Baton
from agent.parking.setup import ParkingOptions
from tests.agent.client.test_client_close import GPU, WAIT_S
from tests.agent.client.test_restore_with_grant import Recorded, switch
from tests.harness.agent import AgentRunner

pytestmark = pytest.mark.timeout(60)


class RestoreFailed(logging.Handler):
    """Set once the agent logs a failed attempt at a restore (`agent.parking.moving`)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args
        if (
            "failed (attempt" in str(record.msg)
            and isinstance(args, tuple)
            and args[:1] == ("restore",)
        ):
            self.seen.set()


@pytest.fixture
def restore_failed() -> Iterator[RestoreFailed]:
    handler, logger = RestoreFailed(), logging.getLogger("agent.parking.moving")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def test_a_restore_that_finished_after_the_agent_gave_up_is_not_run_again(
    workdir: str, restore_failed: RestoreFailed
) -> None:
    parking = ParkingOptions(backend="app", fake_gpus="1x100", callback_timeout_s=0.2)
    recorded = {name: Recorded() for name in ("a", "b")}
    restores: list[str] = []

    def late_restore(gpu: str) -> int:
        """The first restore ends only once the agent has given up on it."""
        restores.append(gpu)
        if len(restores) == 1:
            assert restore_failed.seen.wait(WAIT_S), "the agent never timed the restore out"
        return recorded["a"].restore(gpu)

    def parker(name: str, on_restore: Callable[[str], int]) -> Baton:
        return Baton(
            agent.socket, [GPU], name=name, gpu_memory_mib=60,
            on_park=recorded[name].park, on_restore=on_restore,
        )  # fmt: skip

    with AgentRunner(workdir, queue_policy="fifo", parking=parking) as agent:
        a_plain = Baton(agent.socket, [GPU], name="a", gpu_memory_mib=60)  # no callbacks
        with (
            parker("a", late_restore) as a_parks,
            a_plain,
            parker("b", recorded["b"].restore) as b,
        ):
            a_parks.connect()
            switch(agent, {"a": a_plain, "b": b}, "a", "b")  # a parked (a_parks' on_park)
            b.yield_()
            # a's plain process asks for the turn: the agent restores a by callback, and the
            # process that parks a answers only after the agent timed that restore out.
            a_plain.acquire(WAIT_S)
            assert restores == [GPU]  # not run again on memory that is back
            assert a_parks._callbacks_run.parked.bytes == {}
            assert a_plain.tenant is not None
            entry = agent.status()["residency"]["tenants"][a_plain.tenant.tenant_id]
            assert entry["residency"] == "resident"
    assert [c for c, _ in recorded["a"].calls] == ["park", "restore"]

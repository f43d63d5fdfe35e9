"""A tenant's first park/restore callbacks, mistakes included, against a real agent (`app`
method): a two-GPU tenant parked by `TorchParker`, a park that answers a negative byte count,
and a tenant that registered `on_park` alone (and the tenant that waits behind it)."""

from __future__ import annotations

import importlib.util
import logging
import threading
from collections.abc import Iterator

import pytest

from agent.client import AcquireTimeout, Baton
from agent.client.types import Callback
from agent.core.events import QUEUED
from agent.parking.setup import ParkingOptions
from baton.contract.names import MIB
from tests.harness.agent import AgentRunner

pytestmark = pytest.mark.timeout(60)
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
GPUS = ["GPU-fake-0000", "GPU-fake-0001"]
WAIT_S = 20.0


@pytest.fixture
def two_gpus(workdir: str) -> Iterator[AgentRunner]:
    """An agent whose two 100 MiB GPUs each hold one 60 MiB tenant: every switch parks."""
    options = ParkingOptions(backend="app", fake_gpus="2x100")
    with AgentRunner(workdir, parking=options) as runner:
        yield runner


def client(
    agent: AgentRunner, name: str, on_park: Callback, on_restore: Callback | None = None
) -> Baton:
    return Baton(
        agent.socket, GPUS, name=name, gpu_memory_mib=60, on_park=on_park, on_restore=on_restore
    )


def moves(gpu: str) -> int:
    return 60 * MIB


def queued_behind(agent: AgentRunner, holder: Baton, taker: Baton, timeout: float) -> dict:
    """`holder` holds both GPUs, `taker` queues for them and `holder` yields: what the taker's
    `acquire(timeout)` returned ("lease") or raised ("error")."""
    out: dict = {}
    holder.acquire(WAIT_S)
    taker.connect()
    since = agent.mark()

    def take() -> None:
        try:
            out["lease"] = taker.acquire(timeout)
        except AcquireTimeout as exc:
            out["error"] = exc

    thread = threading.Thread(target=take)
    thread.start()
    assert taker.tenant is not None
    tenant_id = taker.tenant.tenant_id
    agent.wait_event(lambda e: e.kind == QUEUED and e.tenant_id == tenant_id, WAIT_S, since)
    holder.yield_()
    thread.join(timeout + WAIT_S)
    assert not thread.is_alive(), "the taker's acquire never returned"
    return out


@needs_torch
def test_a_torch_parker_parks_a_tenant_of_two_gpus(two_gpus: AgentRunner) -> None:
    """The agent asks for a park on each GPU; the parker moved everything on the first and used
    to refuse the second ("already parked"), so the other tenant never got its turn."""
    import torch

    from agent.client.torch import TorchParker

    model = torch.nn.Linear(64, 64)
    before = [p.detach().clone() for p in model.parameters()]
    parker = TorchParker(model)
    a = client(two_gpus, "a", on_park=parker.park, on_restore=parker.restore)
    b = client(two_gpus, "b", on_park=moves, on_restore=moves)
    try:
        out = queued_behind(two_gpus, a, b, WAIT_S)
        assert "lease" in out, out.get("error")
        assert parker.parked
        b.yield_()
        a.acquire(WAIT_S)
        assert not parker.parked
        assert all(torch.equal(x, y) for x, y in zip(before, model.parameters(), strict=True))
        assert (parker.stats.parks, parker.stats.restores) == (1, 1)
    finally:
        a.close()
        b.close()


def test_a_park_that_answers_negative_bytes_is_a_failed_park_that_says_so(
    two_gpus: AgentRunner,
) -> None:
    """It used to count -5 bytes parked and fail inside the metrics ("Counters can only be
    incremented by non-negative amounts"), with the parked bytes negative in /v1/status."""
    a = client(two_gpus, "a", on_park=lambda gpu: -5, on_restore=moves)
    b = client(two_gpus, "b", on_park=moves, on_restore=moves)
    try:
        out = queued_behind(two_gpus, a, b, 2.0)
        assert "returned -5 bytes moved" in out["error"].reason
        residency = two_gpus.status()["residency"]
        assert residency["parked_bytes"] >= 0
        assert residency["tenants"]["local/a"]["parked_bytes"] >= 0
    finally:
        a.close()
        b.close()


def test_a_tenant_with_on_park_alone_is_not_parked_where_it_cannot_come_back(
    two_gpus: AgentRunner,
) -> None:
    """Parked by its on_park, it had no on_restore to come back with: its every later turn
    failed ("has no session with an on_restore callback"). Now it stays resident, and the
    tenant kept waiting is told why."""
    parks: list[str] = []

    def park(gpu: str) -> int:
        parks.append(gpu)
        return 60 * MIB

    a = client(two_gpus, "a", on_park=park)
    b = client(two_gpus, "b", on_park=moves, on_restore=moves)
    try:
        out = queued_behind(two_gpus, a, b, 2.0)
        assert "no on_park with an on_restore" in out["error"].reason
        assert parks == []
        a.acquire(WAIT_S)  # its memory never left
        a.yield_()
    finally:
        a.close()
        b.close()


class _Heard(logging.Handler):
    """Sets `event` when the client logs a line holding each of `words`."""

    def __init__(self, *words: str) -> None:
        super().__init__(logging.WARNING)
        self.words, self.event = words, threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if all(w in record.getMessage() for w in self.words):
            self.event.set()


def test_a_waiter_with_no_timeout_hears_why_no_room_is_made(two_gpus: AgentRunner) -> None:
    """A resident tenant that cannot be parked keeps the tenant that needs its room waiting
    until it leaves; an acquire with no timeout heard nothing of why (the agent's log alone
    said it). Now its client logs the reason as it waits, once."""
    a = client(two_gpus, "a", on_park=moves)  # on_park alone: it cannot be parked
    b = client(two_gpus, "b", on_park=moves, on_restore=moves)
    heard = _Heard(f"the turn on [{', '.join(GPUS)}] waits:", "local/a offers no on_park")
    logger = logging.getLogger("baton.client")
    logger.addHandler(heard)
    out: dict = {}
    thread = threading.Thread(target=lambda: out.update(lease=b.acquire()))
    try:
        a.acquire(WAIT_S)
        a.yield_()  # resident on both GPUs
        thread.start()
        assert heard.event.wait(WAIT_S), "the waiter's client never said why it waits"
        a.close()  # it leaves, and its memory with it
        thread.join(WAIT_S)
        assert not thread.is_alive() and "lease" in out
    finally:
        logger.removeHandler(heard)
        a.close()
        b.close()
        thread.join(WAIT_S)


def test_a_turn_whose_park_failed_is_tried_again_without_another_change(
    two_gpus: AgentRunner,
) -> None:
    """The holder's on_park failed each time the grant tried it (a transient error, or a
    callback past --move-timeout that finished later): the waiter used to stay blocked until
    some other tenant acquired or yielded, for ever with no timeout. Now it is tried again."""
    # Its parks at the yield (one per GPU) and the grant's three attempts on the first GPU fail.
    failures = [RuntimeError("device busy")] * 5

    def park(gpu: str) -> int:
        if failures:
            raise failures.pop()
        return 60 * MIB

    a = client(two_gpus, "a", on_park=park, on_restore=moves)
    b = client(two_gpus, "b", on_park=moves, on_restore=moves)
    try:
        out = queued_behind(two_gpus, a, b, WAIT_S)
        assert "lease" in out, out.get("error")
        assert failures == []
    finally:
        a.close()
        b.close()


def test_a_park_that_answers_no_number_still_comes_back(
    two_gpus: AgentRunner, caplog: pytest.LogCaptureFixture
) -> None:
    """Its answer ("lots") used to fail the park after the callback had moved the memory: the
    client did not count it parked, so its next turn began without a restore."""
    restored: list[str] = []

    def restore(gpu: str) -> int:
        restored.append(gpu)
        return 60 * MIB

    a = client(two_gpus, "a", on_park=lambda gpu: "lots", on_restore=restore)  # type: ignore[arg-type, return-value]
    b = client(two_gpus, "b", on_park=moves, on_restore=moves)
    try:
        with caplog.at_level("WARNING", logger="baton.client"):
            out = queued_behind(two_gpus, a, b, WAIT_S)
        assert "lease" in out, out.get("error")
        assert "returned 'lots', not the bytes it moved" in caplog.text
        b.yield_()
        a.acquire(WAIT_S)
        assert sorted(restored) == GPUS  # what its on_park moved came back before its turn
        a.yield_()
    finally:
        a.close()
        b.close()


def test_a_restore_is_asked_of_the_process_that_could_park(two_gpus: AgentRunner) -> None:
    """Tenant a's process x offers on_restore alone, its process y both callbacks: only y can
    be parked. A turn of x's used to ask x to restore what y parked: x's on_restore ran on
    nothing, y's memory stayed parked and the agent counted it back on the GPUs."""
    ran: list[tuple[str, str]] = []

    def callback(who: str, action: str) -> Callback:
        def run(gpu: str) -> int:
            ran.append((who, action))
            return 60 * MIB

        return run

    x = Baton(
        two_gpus.socket, GPUS, name="a", gpu_memory_mib=60, on_restore=callback("x", "restore")
    )
    y = client(two_gpus, "a", on_park=callback("y", "park"), on_restore=callback("y", "restore"))
    b = client(two_gpus, "b", on_park=moves, on_restore=moves)
    try:
        x.connect()  # x's session first
        out = queued_behind(two_gpus, y, b, WAIT_S)
        assert "lease" in out, out.get("error")
        assert ran == [("y", "park")] * 2
        b.yield_()
        x.acquire(WAIT_S)
        assert ran[2:] == [("y", "restore")] * 2
        x.yield_()
    finally:
        x.close()
        y.close()
        b.close()


def test_a_tenant_whose_first_park_moves_both_gpus_comes_back(two_gpus: AgentRunner) -> None:
    """`TorchParker`'s way with a tenant of several GPUs: the first park moves everything (its
    60 MiB on each GPU: 120 MiB) and the other moves 0 bytes. The agent counted the 120 MiB on
    the first GPU, which holds 100 MiB: the tenant's every later turn was refused as too
    large, its memory parked for good."""
    parked: list[bool] = []

    def park(gpu: str) -> int:
        parked.append(True)
        return 120 * MIB if len(parked) == 1 else 0

    def restore(gpu: str) -> int:
        moved = 120 * MIB if parked else 0
        parked.clear()
        return moved

    a = client(two_gpus, "a", on_park=park, on_restore=restore)
    b = client(two_gpus, "b", on_park=moves, on_restore=moves)
    try:
        out = queued_behind(two_gpus, a, b, WAIT_S)
        assert "lease" in out, out.get("error")
        b.yield_()
        a.acquire(WAIT_S)
        assert not parked
        a.yield_()
    finally:
        a.close()
        b.close()

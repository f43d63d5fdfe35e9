"""A tenant whose turn is being prepared leaves (its last session ends) while the preparation
waits or moves others' memory: the preparation ends quietly, as a refusal its gone waiter never
hears, with nothing registered, held or counted for it and the model as the moves left the node."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from agent.core.residency import NoRoom
from agent.parking.backends.base import BackendError, Residency
from agent.parking.fakegpu import FakeGpuMemory
from agent.parking.preparer import ParkingPreparer
from baton.contract.names import MIB

from .conftest import GPU
from .test_preparer import Host, run

WAIT_S = 10


def held_parks(backend, fail=False):
    """Parks that block until the test lets them go (then fail, with `fail`); the events."""
    parking, let_go = threading.Event(), threading.Event()
    park = backend.park

    def held(tenant_id, gpu):
        parking.set()
        assert let_go.wait(WAIT_S)
        if fail:
            raise BackendError(f"{tenant_id}: park on {gpu} failed")
        return park(tenant_id, gpu)

    backend.park = held
    return parking, let_go


@pytest.mark.parametrize("way", ["ahead", "behind a revocation", "during its moves", "failed"])
def test_a_tenant_that_leaves_while_its_turn_is_prepared_is_not_prepared(backend, caplog, way):
    """a is resident with 60 MiB and its turn ended (or is being revoked); b's turn needs a
    parked. b leaves while a's park is held: during b's preparation ahead (b's grant waits on
    it, and the agent's `forget` of b runs first), while the revocation of a holds the node (b's
    grant waits for it), or during its grant's own park of a (which then fails, or not)."""
    host = Host("a", "b")
    prep = ParkingPreparer(
        backend, {GPU: 100 * MIB}, host_budget=1000 * MIB, host=host, backoff=0.0
    )
    run(prep.prepare("a", [GPU]))
    FakeGpuMemory("a", backend.root, timeout=1.0).allocate(GPU, 60)
    parking, let_go = held_parks(backend, fail=way == "failed")

    async def leaves_during_the_park():
        if way != "behind a revocation":  # a's turn ended: b is due
            prep.released("a", [GPU])
        first: asyncio.Future[object]
        if way == "ahead":  # a's park is b's room, made ahead of b's turn
            first = asyncio.ensure_future(prep.prepare_ahead("b", [GPU]))
        elif way == "behind a revocation":
            first = asyncio.ensure_future(prep.revoke("a", [GPU]))
        else:
            first = asyncio.ensure_future(prep.prepare("b", [GPU]))
        assert await asyncio.to_thread(parking.wait, WAIT_S)
        grant = first
        if way in ("ahead", "behind a revocation"):
            grant = asyncio.ensure_future(prep.prepare("b", [GPU]))
            await asyncio.sleep(0)  # b's grant waits (on the preparation ahead, or the lock)
        del host.refs["b"]  # b's last session ends: the agent forgets it
        forget = asyncio.ensure_future(prep.forget("b"))
        let_go.set()
        outcomes = await asyncio.gather(first, grant, forget, return_exceptions=True)
        await prep.settled()
        return outcomes[1]

    caplog.set_level(logging.INFO)
    outcome = run(leaves_during_the_park())
    assert isinstance(outcome, NoRoom), outcome
    assert str(outcome) == "b left before its turn was ready"
    assert "b left while its turn was being prepared: no room is made for it" in caplog.messages
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "stopped" not in caplog.text  # the preparation ahead ended as it should
    # Nothing of b is left: not registered again, not holding, not in the model or waiting.
    assert "b" not in prep._refs and "b" not in prep._holding
    assert "b" not in prep._model.states and "b" not in prep._model.unsettled
    assert set(prep.status()["tenants"]) == {"a"}
    assert not prep._waiting and not prep._refused
    # The model has a where its park (made, or failed) left it.
    where = Residency.RESIDENT if way == "failed" else Residency.PARKED
    assert backend.state("a").residency == {GPU: where}
    assert prep.status()["tenants"]["a"]["gpus"] == {GPU: where.value}

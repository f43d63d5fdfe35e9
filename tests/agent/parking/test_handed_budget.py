"""A restore left to the granted tenant's own process (`hand_restore`) may still fail, and the
tenant then ends its turn with that memory parked (`not_restored`): until its turn ends, the host
budget holds those bytes, so that another grant does not park into them meanwhile. The real
TurnPreparer over the app backend."""

from __future__ import annotations

import asyncio
from collections.abc import Collection

import pytest

from agent.core.planner import NodeView
from agent.core.residency import NoRoom
from agent.parking.backends.app import AppBackend
from agent.parking.backends.base import TenantRef
from agent.parking.preparer import ParkingPreparer
from baton.contract.names import MIB

from .conftest import GPU

OTHER = "GPU-fake-0001"
BUDGET = 120 * MIB


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


def preparer(calls: list[tuple[str, str]]) -> ParkingPreparer:
    """Two 100 MiB GPUs, a 120 MiB host budget; every app park or restore moves 60 MiB."""

    async def call_tenant(tenant_id: str, action: str, gpu: str, timeout: float) -> int:
        calls.append((tenant_id, action))
        return 60 * MIB

    return ParkingPreparer(
        AppBackend(call_tenant=call_tenant),
        {GPU: 100 * MIB, OTHER: 100 * MIB},
        host_budget=BUDGET,
        backoff=0.0,
    )


async def b_handed(prep: ParkingPreparer) -> None:
    """x holds the other GPU; a's turn parks b by callback, then b's parks a and leaves b's
    restore to b: 60 MiB parked, b counted resident, its 60 MiB held in the budget."""
    for name, gpu in (("a", GPU), ("b", GPU), ("x", OTHER)):
        prep.register(TenantRef(name, (gpu,), declared_bytes=60 * MIB))
    await prep.prepare("x", [OTHER])
    await prep.prepare("a", [GPU])
    prep.released("a", [GPU])
    await prep.prepare("b", [GPU], handed=True)


def y_waits(prep: ParkingPreparer) -> None:
    """y asks the other GPU: its turn would park x, 60 MiB more."""
    prep.register(TenantRef("y", (OTHER,), declared_bytes=60 * MIB))


def test_a_handed_restore_keeps_its_bytes_in_the_host_budget_until_the_turn_ends() -> None:
    calls: list[tuple[str, str]] = []
    prep = preparer(calls)

    async def turns() -> None:
        await b_handed(prep)
        assert calls == [("b", "park"), ("a", "park")]
        assert prep.status()["parked_bytes"] == 60 * MIB  # b counted resident at once
        y_waits(prep)  # 60 MiB more, which b may still need
        with pytest.raises(NoRoom, match="budget"):
            await prep.prepare("y", [OTHER])
        prep.not_restored("b", {GPU: 60 * MIB})  # b's restore failed: it gives its turn back
        prep.released("b", [GPU])
        assert prep.status()["parked_bytes"] <= BUDGET

    run(turns())


def test_a_revocation_that_does_not_go_ahead_keeps_the_holders_bytes_in_the_budget() -> None:
    """b's restore is left to it; a revocation of b begins, and its waiters leave while the
    node is read: b keeps its turn, and the budget still holds its bytes for it."""
    prep = preparer([])
    asked = iter([True, False])  # someone waited for b's GPU, then left during the read

    async def turns() -> None:
        await b_handed(prep)
        assert not await prep.revoke("b", [GPU], waited=lambda: next(asked))
        y_waits(prep)
        with pytest.raises(NoRoom, match="budget"):
            await prep.prepare("y", [OTHER])

    run(turns())


def test_a_park_at_yield_told_during_a_revocations_read_stands() -> None:
    """While the revocation reads the node, b is told to park 70 MiB at its yield; the
    revocation does not go ahead, and what b was told then is what the budget holds, not the
    60 MiB held before."""
    prep = preparer([])
    reread = prep._reread

    async def told_meanwhile(gpus: Collection[str] = ()) -> NodeView:
        prep._reread = reread  # type: ignore[method-assign]  # once, in the revocation's read
        prep.told_to_park("b", [GPU], {GPU: 70 * MIB})
        return await reread(gpus)

    async def turns() -> None:
        await b_handed(prep)
        prep._reread = told_meanwhile  # type: ignore[method-assign,assignment]
        assert not await prep.revoke("b", [GPU], waited=iter([True, False]).__next__)
        y_waits(prep)
        with pytest.raises(NoRoom, match="70 MiB to be parked by holders as they yield"):
            await prep.prepare("y", [OTHER])

    run(turns())

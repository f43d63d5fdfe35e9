"""A grant that moves nothing is made from the agent's model at once; a stale model is caught."""

from __future__ import annotations

import asyncio
import logging

from agent.core import eager
from agent.parking.backends.app import AppBackend
from agent.parking.backends.base import TenantRef
from agent.parking.fakegpu import FakeGpuMemory
from agent.parking.preparer import ParkingPreparer
from baton.contract.names import MIB

from .conftest import GPU

OTHER = "GPU-fake-0001"


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


class Counting:
    """Counts the backend's reads (state, memory limit and use) around a fake backend."""

    def __init__(self, backend):
        self.backend = backend
        self.reads = 0
        for name in ("state", "memory_limit", "memory_used"):
            setattr(self, name, self._counted(getattr(backend, name)))

    def _counted(self, fn):
        def read(tenant_id):
            self.reads += 1
            return fn(tenant_id)

        return read

    def __getattr__(self, name):
        return getattr(self.backend, name)


def preparer(backend, *tenants, declared=True):
    """A preparer over a counting backend; each tenant allocates its MiB in a first turn."""
    counting = Counting(backend)
    prep = ParkingPreparer(
        counting,  # type: ignore[arg-type]
        {GPU: 100 * MIB},
        host_budget=1000 * MIB,
        backoff=0.0,
    )
    mems = {}

    async def first_turns():
        for name, mib in tenants:
            prep.register(TenantRef(name, (GPU,), declared_bytes=mib * MIB if declared else None))
            await prep.prepare(name, [GPU])
            mems[name] = FakeGpuMemory(name, backend.root, timeout=1.0)
            mems[name].allocate(GPU, mib)
        await prep.settled()

    run(first_turns())
    return prep, counting, mems


async def grant(prep, tenant_id):
    """Prepare the tenant's turn; True if that finished without suspending once."""
    done, _, rest = eager.start(prep.prepare(tenant_id, [GPU]))
    if rest is not None:
        await rest
    return done


def residency(prep):
    return {t: e["residency"] for t, e in prep.status()["tenants"].items()}


def test_a_turn_that_moves_nothing_is_granted_at_once_without_reading_the_backend(backend):
    prep, counting, _ = preparer(backend, ("a", 30), ("b", 30))

    async def pingpong():
        before = counting.reads
        for name in "abab":
            done, _, rest = eager.start(prep.prepare(name, [GPU]))
            assert done and rest is None, f"{name}'s grant waited"
            assert counting.reads == before, f"{name}'s grant read the backend"
        await prep.settled()  # read off the grants' path: the tenants whose turns ended
        assert counting.reads > before

    run(pingpong())
    assert residency(prep) == {"a": "resident", "b": "resident"}


def test_a_turn_that_must_move_memory_still_moves_it_first(backend):
    prep, _, _ = preparer(backend, ("a", 60), ("b", 60))
    assert not run(grant(prep, "a"))  # b is resident: b is parked, a restored, then a's turn
    assert residency(prep) == {"a": "resident", "b": "parked"}


def test_a_tenant_that_grew_within_its_declaration_is_counted_whole_before_the_next_grant(backend):
    # a declared 60 but held nothing when last read; during its turn it allocates it. c needs
    # 40 beside it: the model counts a with all it declared, so c's grant parks b first instead
    # of starting c's turn on memory that is not free.
    prep, _, _ = preparer(backend, ("b", 30))

    async def turns():
        prep.register(TenantRef("a", (GPU,), declared_bytes=60 * MIB))
        prep.register(TenantRef("c", (GPU,), declared_bytes=40 * MIB))
        await prep.refresh()
        assert await grant(prep, "a")
        FakeGpuMemory("a", backend.root).allocate(GPU, 60)
        assert not await grant(prep, "c")

    run(turns())
    assert residency(prep)["b"] == "parked"


def test_a_tenant_that_declared_nothing_is_read_before_a_grant_that_needs_room_beside_it(backend):
    prep, counting, mems = preparer(backend, ("a", 30), ("b", 30), declared=False)

    async def turns():
        prep.register(TenantRef("c", (GPU,), declared_bytes=40 * MIB))
        await prep.refresh()
        assert await grant(prep, "a")
        mems["a"].allocate(GPU, 60)  # a grows during its turn; it declared no bound
        before = counting.reads
        assert not await grant(prep, "c")  # c needs 40 beside a: a is read first
        assert counting.reads > before

    run(turns())
    assert residency(prep)["b"] == "parked"


def test_a_backend_that_disagrees_is_believed_before_the_tenants_next_turn(backend, caplog):
    prep, _, _ = preparer(backend, ("a", 30), ("b", 30))
    caplog.set_level(logging.WARNING)

    async def turns():
        assert await grant(prep, "a")
        backend.park("a", GPU)  # during a's turn, a's memory leaves the device unknown to us
        assert await grant(prep, "b")  # b's memory is there: its turn moves nothing
        await prep.settled()  # the read after a's turn sees a parked
        assert "the backend has a parked" in caplog.text
        assert not await grant(prep, "a")  # a is restored before its turn

    run(turns())
    assert residency(prep)["a"] == "resident"


def test_a_tenant_that_outgrew_its_declaration_is_parked_for_the_holder_and_read_from_then_on(
    backend, caplog
):
    prep, _, mems = preparer(backend, ("a", 30), ("b", 30))
    caplog.set_level(logging.WARNING)

    async def turns():
        assert await grant(prep, "a")
        mems["a"].allocate(GPU, 90)  # a declared 30; it takes 90 during its turn
        assert await grant(prep, "b")  # b holds its memory already: its turn moves nothing
        await prep.settled()  # the read after a's turn finds a outgrown: b's room is made
        assert "more than the" in caplog.text
        assert residency(prep)["a"] == "parked"
        assert not await grant(prep, "a")  # a comes back (b parked) before its turn

    run(turns())
    assert residency(prep) == {"a": "resident", "b": "parked"}


def test_turns_that_repeat_over_an_unchanged_model_plan_once_each(backend, monkeypatch):
    prep, _, _ = preparer(backend, ("a", 30), ("b", 30))
    plans: list[str] = []
    draw = prep._plan_over_model

    def counted(tenant_id, *rest):
        plans.append(tenant_id)
        return draw(tenant_id, *rest)

    monkeypatch.setattr(prep, "_plan_over_model", counted)

    async def rounds(n):
        for name in "ab" * n:
            assert await grant(prep, name)
            await prep.settled()  # the reads between turns find nothing changed

    run(rounds(2))
    drawn = len(plans)
    run(rounds(20))
    assert drawn > 0 and len(plans) == drawn, f"planned {len(plans) - drawn} times more"


def test_a_verdict_kept_from_earlier_turns_gives_way_to_a_read_that_changes_the_model(
    backend, caplog
):
    prep, _, _ = preparer(backend, ("a", 30), ("b", 30))
    caplog.set_level(logging.WARNING)

    async def turns():
        for name in "abab":  # a's and b's verdicts are kept for the turns to come
            assert await grant(prep, name)
            await prep.settled()
        assert await grant(prep, "a")
        backend.park("a", GPU)  # during a's turn, a's memory leaves the device unknown to us
        assert await grant(prep, "b")
        await prep.settled()  # the read after a's turn sees a parked
        assert "the backend has a parked" in caplog.text
        assert not await grant(prep, "a")  # not the verdict kept from before: a is restored

    run(turns())
    assert residency(prep)["a"] == "resident"


def test_a_turn_that_needs_only_its_own_restores_leaves_them_to_it_at_once() -> None:
    # App method: b parks itself as it yields (the agent asked it to); a's grant then needs
    # nothing but a's own restore, which a's client makes as the grant arrives. Granted from
    # the model: no read of the node (a's own record only), no callback, no suspension.
    calls: list[tuple[str, str]] = []

    async def call_tenant(tenant_id: str, action: str, gpu: str, timeout: float) -> int:
        calls.append((tenant_id, action))
        return 60 * MIB

    counting = Counting(AppBackend(call_tenant=call_tenant))
    prep = ParkingPreparer(
        counting,  # type: ignore[arg-type]
        {GPU: 100 * MIB},
        host_budget=1000 * MIB,
        backoff=0.0,
    )

    async def turns() -> None:
        for name in "ab":
            prep.register(TenantRef(name, (GPU,), declared_bytes=60 * MIB))
        await prep.prepare("a", [GPU])  # both counted resident as declared: b is parked
        await prep.prepare("b", [GPU])  # a parked, b restored, by callback
        assert calls == [("b", "park"), ("a", "park"), ("b", "restore")]
        prep.parked_at_yield("b", {GPU: 60 * MIB})  # b's turn ends, b parked itself
        await prep.settled()
        reads = counting.reads
        done, _, rest = eager.start(prep.prepare("a", [GPU], handed=True))
        assert done and rest is None, "a's grant waited"
        assert counting.reads - reads == 3, "read more than a's own record"
        assert len(calls) == 3  # no callback
        assert residency(prep) == {"a": "resident", "b": "parked"}
        # Without the hand-over (a client that restores by callback) the agent restores it.
        prep.parked_at_yield("a", {GPU: 60 * MIB})
        await prep.prepare("b", [GPU])
        assert calls[-1] == ("b", "restore")

    run(turns())


def test_a_park_at_yield_is_hinted_only_within_the_host_budget_of_the_whole_node() -> None:
    # h holds GPU-0 and i waits for it; x is parked from GPU-1. i's turn would park h: the hint
    # counts x's parked bytes too (the host budget is the node's), and what other holders were
    # told to park.
    async def call_tenant(tenant_id: str, action: str, gpu: str, timeout: float) -> int:
        return 60 * MIB

    def node(budget_mib: int) -> ParkingPreparer:
        prep = ParkingPreparer(
            AppBackend(call_tenant=call_tenant),
            {GPU: 100 * MIB, OTHER: 100 * MIB},
            host_budget=budget_mib * MIB,
            backoff=0.0,
        )

        async def turns() -> None:
            prep.register(TenantRef("x", (OTHER,), declared_bytes=60 * MIB))
            for name in "hi":
                prep.register(TenantRef(name, (GPU,), declared_bytes=60 * MIB))
            await prep.prepare("x", [OTHER])
            prep.parked_at_yield("x", {OTHER: 60 * MIB})
            await prep.prepare("h", [GPU])  # parks i by callback
            await prep.settled()

        run(turns())
        return prep

    roomy = node(300)
    assert roomy.parks_at_yield("h", "i", [GPU]) == {GPU: 60 * MIB}
    assert roomy.parks_at_yield("h", "i", [GPU], reserved=200 * MIB) == {}
    # x's 60 MiB and i's 60 MiB parked: parking h too would pass 150 MiB (the planner counts
    # what is parked before the restore that follows).
    assert node(150).parks_at_yield("h", "i", [GPU]) == {}

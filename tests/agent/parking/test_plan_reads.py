"""What a moving grant and a preparation ahead read of the node: only the tenants it moved, after
its moves, where the agent's model can plan it; every tenant first where it cannot, or where it
finds no room; nothing ahead where the model shows that no room can be made. The real
TurnPreparer over the fake backend."""

from __future__ import annotations

from agent.parking.backends.base import Residency, TenantRef
from agent.parking.fakegpu import FakeGpuMemory
from agent.parking.preparer import ParkingPreparer
from baton.contract.names import MIB

from .conftest import GPU
from .test_preparer import run, setup


def count_reads(backend) -> list[str]:
    """The tenants the backend is asked the state of, in order, from now on."""
    asked: list[str] = []
    state = backend.state

    def counted(tenant_id):
        asked.append(tenant_id)
        return state(tenant_id)

    backend.state = counted
    return asked


def four_tenants(backend, declared=True):
    """a 60, b 20, c 10, d 60 MiB of a 100 MiB GPU; d's first turn parked a, then b and c took
    turns: d is the least recently served resident, so a's turn parks d alone. With `declared`
    False, c declared nothing: its growth since its turn has no bound."""
    prep, reg, mems = setup(backend, ("a", 60), ("b", 20), ("c", 10), ("d", 60))
    if not declared:
        prep.register(TenantRef("c", (GPU,)))

    async def b_and_c():
        await prep.prepare("b", [GPU])
        await prep.settled()
        await prep.prepare("c", [GPU])  # c holds its turn: unsettled, as the loop leaves it

    run(b_and_c())
    assert prep.status()["tenants"]["a"]["residency"] == "parked"
    return prep, reg, mems


def test_a_moving_grant_planned_from_the_model_reads_only_the_tenants_it_moved(backend):
    prep, _, mems = four_tenants(backend)
    asked = count_reads(backend)
    run(prep.prepare("a", [GPU]))
    assert asked == ["a", "d"]  # after the moves; the plan came from the model
    mems["a"].verify_pattern(GPU, 0)
    # The model the next grants plan on is what the backend says, not only for those it read.
    for name in "abd":
        assert prep._model.states[name] == backend.state(name), name
    residency = {t: s["residency"] for t, s in prep.status()["tenants"].items()}
    assert residency == {"a": "resident", "b": "resident", "c": "resident", "d": "parked"}
    assert prep.status()["parked_bytes"] == 60 * MIB


def test_a_moving_grant_beside_a_tenant_of_unbounded_growth_reads_the_node_first(backend):
    prep, _, mems = four_tenants(backend, declared=False)
    asked = count_reads(backend)
    run(prep.prepare("a", [GPU]))
    assert asked == ["a", "b", "c", "d", "a", "d"]
    mems["a"].verify_pattern(GPU, 0)
    for name in "abcd":
        assert prep._model.states[name] == backend.state(name), name


def test_room_the_model_cannot_find_is_looked_for_in_the_backend(backend):
    """t (60 MiB, read after its turn) frees its memory unseen; y (50) asks: the model must park
    t, which would pass the 55 MiB host budget, and finds no room; the backend shows that y fits
    beside what t holds now."""
    prep = ParkingPreparer(backend, {GPU: 100 * MIB}, host_budget=55 * MIB, backoff=0.0)
    t = FakeGpuMemory("t", backend.root, timeout=1.0)

    async def turns():
        prep.register(TenantRef("t", (GPU,)))
        await prep.prepare("t", [GPU])
        t.allocate(GPU, 60)
        prep.register(TenantRef("z", (GPU,), declared_bytes=MIB))
        await prep.prepare("z", [GPU])  # reads the node (t's growth had no bound): t settled
        t.allocate(GPU, 0)  # t frees its memory; the model still has its 60 MiB
        prep.register(TenantRef("y", (GPU,), declared_bytes=50 * MIB))
        asked = count_reads(backend)
        await prep.prepare("y", [GPU])
        return asked

    asked = run(turns())
    assert sorted(asked) == ["t", "y", "z"]  # the read the plan started from; nothing moved
    assert {s["residency"] for s in prep.status()["tenants"].values()} <= {"resident", "none"}


def test_a_grant_after_a_moving_grant_is_made_from_the_model_reading_nothing(backend):
    prep, _, _ = four_tenants(backend)
    run(prep.prepare("a", [GPU]))  # parks d, restores a; reads a and d after
    asked = count_reads(backend)

    async def b_then_c():
        await prep.prepare("b", [GPU])  # resident beside a: granted from the model
        await prep.prepare("c", [GPU])
        return list(asked)  # before the reads that follow the turns, off their path

    assert run(b_then_c()) == []


def test_nothing_is_read_ahead_where_the_model_shows_no_room_beside_the_holder(backend):
    prep, _, _ = setup(backend, ("a", 60), ("b", 60))  # b's first turn parked a
    asked = count_reads(backend)
    run(prep.prepare_ahead("a", [GPU], holders={"b"}))  # b holds 60 of 100: a's 60 cannot fit
    assert asked == []
    assert prep.status()["tenants"]["a"]["residency"] == "parked"


def test_room_that_can_be_made_ahead_is_read_for_and_made(backend):
    prep, _, mems = setup(backend, ("a", 40), ("b", 40), ("c", 40))  # c's turn parked a
    asked = count_reads(backend)

    async def ahead():
        await prep.prepare_ahead("a", [GPU], holders={"c"})  # b is idle: parked for a
        await prep.settled()

    run(ahead())
    assert sorted(set(asked)) == ["a", "b", "c"]
    residency = {t: s["residency"] for t, s in prep.status()["tenants"].items()}
    assert residency == {"a": "resident", "b": "parked", "c": "resident"}
    mems["a"].verify_pattern(GPU, 0)


def test_a_tenant_that_grew_unseen_is_found_by_the_read_before_the_next_plan(backend):
    """The read after the moves is of the moved tenants only; one beside them that holds more
    than the model has is seen by the full read every plan starts from."""
    prep, _, _ = setup(backend, ("a", 60), ("b", 20), ("c", 10), ("d", 60))
    run(prep.prepare("a", [GPU]))  # a 60, b 20, c 10 resident; d parked
    FakeGpuMemory("c", backend.root, timeout=1.0).allocate(GPU, 30)  # c grows, unseen: 110 > 100
    prep.register(TenantRef("c", (GPU,)))  # and is no longer bounded by a declaration
    run(prep.prepare("b", [GPU]))  # reads the node first: c holds 30, so b's turn parks a or c
    states = {t: backend.state(t) for t in "abcd"}
    resident = sum(
        st.footprint_bytes[GPU]
        for st in states.values()
        if st.residency.get(GPU) == Residency.RESIDENT
    )
    assert resident <= 100 * MIB
    assert states["b"].residency[GPU] == Residency.RESIDENT

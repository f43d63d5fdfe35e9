"""What a moving grant and a preparation ahead read of the node: every tenant before a plan, only
the tenants it moved after its moves, and nothing where the model shows that no room can be made
ahead. The real TurnPreparer over the fake backend."""

from __future__ import annotations

from agent.parking.backends.base import Residency, TenantRef
from agent.parking.fakegpu import FakeGpuMemory
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


def four_tenants(backend):
    """a 60, b 20, c 10, d 60 MiB of a 100 MiB GPU; d's first turn parked a, then b and c took
    turns: d is the least recently served resident, so a's turn parks d alone."""
    prep, reg, mems = setup(backend, ("a", 60), ("b", 20), ("c", 10), ("d", 60))

    async def b_and_c():
        await prep.prepare("b", [GPU])
        await prep.prepare("c", [GPU])
        await prep.settled()

    run(b_and_c())
    assert prep.status()["tenants"]["a"]["residency"] == "parked"
    return prep, reg, mems


def test_a_moving_grant_reads_every_tenant_before_its_plan_and_only_those_it_moved_after(backend):
    prep, _, mems = four_tenants(backend)
    asked = count_reads(backend)
    run(prep.prepare("a", [GPU]))
    assert asked == ["a", "b", "c", "d", "a", "d"]
    mems["a"].verify_pattern(GPU, 0)
    # The model the next grants plan on is what the backend says, not only for those it read.
    for name in "abcd":
        assert prep._model.states[name] == backend.state(name), name
    residency = {t: s["residency"] for t, s in prep.status()["tenants"].items()}
    assert residency == {"a": "resident", "b": "resident", "c": "resident", "d": "parked"}
    assert prep.status()["parked_bytes"] == 60 * MIB


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

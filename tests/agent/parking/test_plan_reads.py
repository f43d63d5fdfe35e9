"""What a moving grant and a preparation ahead read of the node: only the tenants it moved, after
its moves, where the agent's model can plan it; every tenant first where it cannot, or where it
finds no room; nothing ahead where the model shows that no room can be made. The real
TurnPreparer over the fake backend."""

from __future__ import annotations

import asyncio
import threading

import pytest

from agent.core.residency import NoRoom
from agent.parking.backends.base import BackendError, Residency, TenantRef
from agent.parking.fakegpu import FakeGpuMemory
from agent.parking.model import Read
from agent.parking.preparer import ParkingPreparer
from baton.contract.names import MIB

from .conftest import GPU
from .test_preparer import Host, run, setup


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


def count_draws(prep, monkeypatch) -> list:
    """The preparer's draws of the node from its model (`_node`), recorded from now on."""
    drawn = []
    draw = prep._node

    def counted(*args, **kwargs):
        drawn.append(args)
        return draw(*args, **kwargs)

    monkeypatch.setattr(prep, "_node", counted)
    return drawn


def test_a_preparation_ahead_draws_the_node_from_the_model_once(backend, monkeypatch):
    """Whether the tenant due next moves nothing and whether room can be made for it are
    answered by one plan over the model: the node is drawn once, not once for each."""
    prep, _, _ = setup(backend, ("a", 60), ("b", 60))  # b's first turn parked a
    drawn = count_draws(prep, monkeypatch)
    run(prep.prepare_ahead("a", [GPU], holders={"b"}))  # no room beside b: nothing to do
    assert len(drawn) == 1


def test_a_grant_that_restores_the_tenant_draws_the_node_from_the_model_once(backend, monkeypatch):
    """A parked tenant's grant moves memory: the model's plan for it is drawn once, under the
    preparer's lock, not first to find that it moves something."""
    prep, _, _ = setup(backend, ("a", 60), ("b", 60))  # b's first turn parked a
    drawn = count_draws(prep, monkeypatch)

    async def grant_a():
        await prep.prepare("a", [GPU])  # parks b, restores a
        return len(drawn)

    assert run(grant_a()) == 1
    assert prep.status()["tenants"]["a"]["residency"] == "resident"


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


def test_a_park_into_a_memory_cgroup_is_planned_from_the_node_as_read(backend):
    """Parked bytes are charged to the tenant's memory cgroup, whose use the model has only as
    last read: a turn that parks a tenant with a limit reads the node first."""
    prep, _, _ = setup(backend, ("a", 60), ("b", 60), limit=1000)  # a has a limit; b parked it
    run(prep.prepare("a", [GPU]))  # parks b (no limit): planned from the model
    asked = count_reads(backend)
    run(prep.prepare("b", [GPU]))  # parks a (a limit): read first
    assert asked == ["a", "b", "a", "b"]
    assert prep.status()["tenants"]["a"]["residency"] == "parked"


def test_moves_planned_from_a_wrong_model_are_planned_again_from_the_node_as_read(backend, caplog):
    """c declared 10 MiB but took 40 in its turn: the model, holding it to its declaration,
    parks d alone for a, and a restore that checks the room (as the driver's allocation does)
    fails; the grant reads the node, parks c or b as well, and restores a."""
    prep, _, mems = four_tenants(backend)  # c holds its turn
    mems["c"].allocate(GPU, 40)  # past its declaration, unseen
    restore = backend.restore

    def restore_with_room(tenant_id, gpu):
        states = [backend.state(t) for t in "abcd" if t != tenant_id]
        resident = sum(
            st.footprint_bytes.get(gpu, 0)
            for st in states
            if st.residency.get(gpu) == Residency.RESIDENT
        )
        if resident + backend.footprint(tenant_id, gpu) > 100 * MIB:
            raise BackendError(f"restore of {tenant_id}: CUDA_ERROR_OUT_OF_MEMORY")
        return restore(tenant_id, gpu)

    backend.restore = restore_with_room
    run(prep.prepare("a", [GPU]))
    mems["a"].verify_pattern(GPU, 0)
    assert "; planning a's turn from the node as read" in caplog.text
    states = {t: backend.state(t) for t in "abcd"}
    resident = [t for t, st in states.items() if st.residency.get(GPU) == Residency.RESIDENT]
    assert "a" in resident and sum(states[t].footprint_bytes[GPU] for t in resident) <= 100 * MIB


def test_a_registration_changed_during_the_moves_has_the_next_turn_read_the_node(backend):
    host = Host("a", "b", "c", mib=40)
    prep = ParkingPreparer(backend, {GPU: 100 * MIB}, host_budget=1000 * MIB, host=host)

    async def first_turns():
        for name in "abc":  # c's turn parks a, the least recently served
            await prep.prepare(name, [GPU])
            FakeGpuMemory(name, backend.root, timeout=1.0).allocate(GPU, 40)

    run(first_turns())
    park = backend.park

    def park_as_c_changes(tenant_id, gpu):  # c's pod declares more meanwhile
        host.refs = {**host.refs, "c": TenantRef("c", (GPU,), declared_bytes=50 * MIB)}
        return park(tenant_id, gpu)

    backend.park = park_as_c_changes
    asked = count_reads(backend)
    run(prep.prepare("a", [GPU]))  # from the model: parks b, restores a; reads those two
    assert asked == ["a", "b"]
    backend.park = park
    del asked[:]
    run(prep.prepare("c", [GPU]))  # c's new registration is not in the model: read in full
    assert asked[:3] == ["a", "b", "c"]


def test_a_read_of_ended_turns_that_memory_moves_overtake_is_made_again(backend):
    """The read of the tenants whose turns ended runs in a worker thread; when a plan moved
    memory meanwhile, that read is dropped and another is due later in the turn."""
    prep, _, _ = setup(backend, ("a", 30), ("b", 30))  # b holds its turn
    started, release = threading.Event(), threading.Event()
    state = backend.state

    def slow_state(tenant_id):
        started.set()
        assert release.wait(5)
        return state(tenant_id)

    async def overtaken():
        await prep.prepare("a", [GPU])  # from the model: b's turn ended, b is unsettled
        backend.state = slow_state
        prep._settle_now()
        assert await asyncio.to_thread(started.wait, 5)
        prep._model.moved(Read({}, {}, prep._model.generation), (), {"a", "b"})  # memory moved
        release.set()
        await prep._settling
        assert "b" in prep._model.unsettled and prep._settle_timer is not None
        backend.state = state
        await prep.settled()
        return set(prep._model.unsettled)

    assert run(overtaken()) == {"a"}


def test_a_park_that_may_pass_the_host_budget_is_planned_from_the_node_as_read(backend):
    """a declared 40 MiB but allocated 60 in its turn; b (70) asks next, with a 50 MiB host
    budget. The model counts a at its declaration (40 fits the budget); parking a moves all 60.
    The grant reads the node first, and refuses the park naming the budget: nothing parked."""
    prep = ParkingPreparer(backend, {GPU: 100 * MIB}, host_budget=50 * MIB, backoff=0.0)

    async def turns():
        prep.register(TenantRef("a", (GPU,), declared_bytes=40 * MIB))
        prep.register(TenantRef("b", (GPU,), declared_bytes=70 * MIB))
        await prep.prepare("a", [GPU])
        FakeGpuMemory("a", backend.root, timeout=1.0).allocate(GPU, 60)
        with pytest.raises(NoRoom, match=r"\(60 MiB\) for b would put 60 MiB .* the 50 MiB budget"):
            await prep.prepare("b", [GPU])

    run(turns())
    status = prep.status()
    assert status["parked_bytes"] == 0
    assert status["tenants"]["a"]["residency"] == "resident"
    assert "50 MiB budget" in status["tenants"]["b"]["waiting"]


def test_a_grant_that_parks_nobody_is_planned_from_the_model_past_a_lowered_budget(backend):
    """a is parked (50 MiB) when the budget is lowered below it (an agent restarted with a
    smaller one): a's restore, which parks nobody, cannot pass any budget, so it is planned from
    the model and reads only a, after its move."""
    prep, _, mems = setup(backend, ("a", 50), ("b", 50), ("c", 40))
    run(prep.settled())
    assert prep.status()["tenants"]["a"]["residency"] == "parked"
    run(prep.forget("c"))
    prep.host_budget = 10 * MIB
    asked = count_reads(backend)
    run(prep.prepare("a", [GPU]))
    assert asked == ["a"]
    mems["a"].verify_pattern(GPU, 0)

"""Property tests of the pure device logic."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from baton.contract import names
from deviceplugin.devices import choose_pod, preferred_allocation
from nodegpu.inventory import Inventory, NodeGpu
from tests.deviceplugin.test_devices import pod

GPUS = [f"GPU-{i}" for i in range(4)]
ALL = [names.slot_device_id(g, s) for g in GPUS for s in range(4)]


@st.composite
def requests(draw):
    available = draw(st.lists(st.sampled_from(ALL), unique=True, min_size=1))
    must = draw(st.lists(st.sampled_from(available), unique=True, max_size=2))
    size = draw(st.integers(min_value=len(must), max_value=len(available)))
    prefer = draw(st.lists(st.sampled_from(GPUS), unique=True, max_size=2))
    return available, must, size, prefer


@given(requests())
def test_preferred_allocation_is_a_valid_answer(request):
    available, must, size, prefer = request
    chosen = preferred_allocation(available, must, size, prefer)
    assert len(chosen) == size == len(set(chosen))
    assert set(must) <= set(chosen) <= set(available)
    gpu = names.gpu_of_device_id
    held = {gpu(d) for d in must}
    new_gpus = {gpu(d) for d in available if d not in must} - held
    extra = len(chosen) - len(must)
    got = {gpu(d) for d in chosen} - held
    # one slot per GPU before a second one: N slots are N GPUs while there are GPUs free
    assert len(got) == min(extra, len(new_gpus))
    # the preferred GPUs (those free, not held) come first
    assert len(got & set(prefer)) == min(extra, len(new_gpus & set(prefer)))


PODS = st.builds(
    pod,
    name=st.sampled_from(["a", "b", "c", "d", "e"]),
    request=st.integers(min_value=1, max_value=2),
    gpus=st.lists(st.sampled_from(GPUS), unique=True, max_size=2),
    at=st.one_of(st.none(), st.integers(min_value=0, max_value=5)),
    created=st.integers(min_value=0, max_value=5),
    allocated=st.booleans(),
    phase=st.sampled_from(["Pending", "Running", "Succeeded"]),
)


@given(st.lists(PODS, unique_by=lambda p: p.name), st.integers(min_value=1, max_value=2))
def test_choose_pod_serves_a_waiting_pod_that_asked_for_this_many(pods, count):
    inventory = Inventory(tuple(NodeGpu(g, i, "m", 1) for i, g in enumerate(GPUS)), 4)
    choice = choose_pod(pods, count, inventory)
    waiting = [p for p in pods if p.waiting and p.gpu_request == count]
    if not waiting:
        assert choice is None
        return
    assert choice is not None and choice.pod in waiting
    assigned = [p for p in waiting if p.assigned_gpus]
    if assigned:
        assert not choice.fallback and choice.gpus == choice.pod.assigned_gpus
        first = min(
            (p.assigned_at_ns if p.assigned_at_ns is not None else p.created_ns) for p in assigned
        )
        got = choice.pod.assigned_at_ns
        assert (got if got is not None else choice.pod.created_ns) == first
    else:
        assert choice.fallback and len(set(choice.gpus)) == len(choice.gpus) == count

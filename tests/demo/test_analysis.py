"""The demo's reading of the agent's events: holds, busy time, switches, idle waits."""

from __future__ import annotations

import pytest

from agent.core import events as ev
from commands.demo.analysis import (
    Hold,
    busy_seconds,
    cycle_duty,
    holds,
    idle_waits,
    on_gpu,
    percentile,
    switches,
)

G = "GPU-fake-0000"


def grant(tenant: str, lease: str, at: float, token: int) -> ev.Event:
    return ev.Event(ev.GRANTED, tenant, at, (G,), lease, {G: token})


def end(kind: str, tenant: str, lease: str, at: float) -> ev.Event:
    return ev.Event(kind, tenant, at, (G,), lease)


EVENTS = [
    ev.Event(ev.TENANT_JOINED, "a", 0.0, (G,)),
    grant("a", "l1", 1.0, 1),
    end(ev.YIELDED, "a", "l1", 2.0),
    grant("b", "l2", 2.5, 2),
    end(ev.REVOKED, "b", "l2", 4.0),
    grant("b", "l3", 4.0, 3),
    end(ev.YIELDED, "b", "l3", 5.0),
    grant("a", "l4", 6.0, 4),
    ev.Event(ev.TENANT_GONE, "a", 7.0),
    grant("b", "l5", 8.0, 5),
]


def test_holds_pair_grants_with_their_ends_and_close_open_ones_at_the_end_of_the_run():
    got = [(h.tenant_id, h.lease_id, h.start, h.end, h.token) for h in holds(EVENTS, 9.0)]
    assert got == [
        ("a", "l1", 1.0, 2.0, 1),
        ("b", "l2", 2.5, 4.0, 2),
        ("b", "l3", 4.0, 5.0, 3),
        ("a", "l4", 6.0, 7.0, 4),
        ("b", "l5", 8.0, 9.0, 5),
    ]


def test_busy_seconds_clip_to_the_window():
    gpu = on_gpu(holds(EVENTS, 9.0), G)
    assert busy_seconds(gpu, 0.0, 9.0) == pytest.approx(1 + 1.5 + 1 + 1 + 1)
    assert busy_seconds(gpu, 1.5, 3.0) == pytest.approx(0.5 + 0.5)


def test_cycle_duty_counts_whole_cycles_from_grant_to_grant():
    # One tenant alone: 1 s on the GPU in every 3 s cycle, first grant at 0.5.
    cycles = [Hold(G, "a", f"l{i}", 0.5 + 3 * i, 1.5 + 3 * i) for i in range(7)]
    # A 10 s window holds four GPU phases (0.5, 3.5, 6.5, 9.5): busy ÷ wall says 0.35 ...
    assert busy_seconds(cycles, 0.0, 10.0) / 10.0 == pytest.approx(0.35)
    # ... the whole cycles between the first and the last grant say what the tenant does.
    assert cycle_duty(cycles, 0.0, 10.0) == pytest.approx(1 / 3)
    assert cycle_duty(cycles, 0.0, 2.0) == pytest.approx(0.5)  # one grant: busy ÷ wall


def test_switches_count_only_changes_of_holder_inside_the_window():
    gpu = on_gpu(holds(EVENTS, 9.0), G)
    assert switches(gpu, 0.0, 9.0) == 3  # a→b, b→a, a→b; b→b is no switch
    assert switches(gpu, 3.0, 9.0) == 2


def test_idle_waits_count_idle_time_after_both_the_free_gpu_and_the_request():
    gpu = on_gpu(holds(EVENTS, 9.0), G)
    asked = {"l1": 0.5, "l2": 1.5, "l3": 3.9, "l4": 5.5, "l5": 7.5}
    # l1 waits from its request; l2 asked while l1 held: idle from l1's end; l3 follows at once;
    # l4 asked after the GPU was free; l5 asked after a's departure freed it.
    assert idle_waits(gpu, asked, 0.0, 9.0) == pytest.approx([0.5, 0.5, 0.0, 0.5, 0.5])
    assert idle_waits(gpu, asked, 5.8, 9.0) == pytest.approx([0.2, 0.5])


def test_percentile_is_nearest_rank_and_zero_without_samples():
    assert percentile([], 0.5) == 0.0
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([3.0, 1.0, 2.0], 0.99) == 3.0

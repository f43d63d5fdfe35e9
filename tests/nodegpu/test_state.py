"""The live inventory tells its listeners every change, newest last."""

from __future__ import annotations

import threading

from nodegpu.inventory import Inventory, NodeGpu
from nodegpu.metrics import Metrics
from nodegpu.state import LiveInventory

WAIT_S = 10.0
A, B = "GPU-a", "GPU-b"


def test_two_threads_changing_health_leave_the_gauges_at_the_newest_state() -> None:
    live = LiveInventory(Inventory((NodeGpu(A, 0, "m", 1), NodeGpu(B, 1, "m", 1)), 2))
    metrics = Metrics()
    told: list[frozenset[str]] = []
    first_entered, first_go_on = threading.Event(), threading.Event()

    def listener(inventory: Inventory) -> None:
        if not told and not first_entered.is_set():  # the first change stalls while telling
            first_entered.set()
            assert first_go_on.wait(WAIT_S)
        told.append(frozenset(inventory.unhealthy))
        metrics.observe_inventory(inventory)

    live.subscribe(listener)
    first = threading.Thread(target=live.set_health, args=(A, False, "xid 79"))
    first.start()
    assert first_entered.wait(WAIT_S)
    assert live.set_health(B, False, "xid 48")  # the other thread's newer change
    first_go_on.set()
    first.join(WAIT_S)
    assert not first.is_alive()

    assert told[-1] == {A, B}, f"listeners last told {sorted(told[-1])}"
    assert [len(t) for t in told] == sorted(len(t) for t in told)  # version order
    assert metrics.unhealthy_gpus._value.get() == 2
    assert metrics.devices.labels(health="Unhealthy")._value.get() == 4

"""The cuda backend built from the agent's flags: `--move-timeout` reaches the driver's lock as
whole milliseconds it can hold, and no deadline flag turns a driver call into a traceback."""

from __future__ import annotations

import math
import threading
from types import SimpleNamespace

import pytest

from agent.parking.backends import cuda as cuda_mod
from agent.parking.backends import deadline
from agent.parking.backends.base import BackendUnavailable, TenantRef
from agent.parking.setup import ParkingOptions, build_backend

from .standin_cuda import CHECKPOINTED, RUNNING, StandInDriver, StandInNvml
from .test_cuda_backend import GIB, GPU


@pytest.fixture
def driver(monkeypatch, tmp_path):
    """The stand-in driver the backend built from flags loads in place of cuda-python."""
    driver = StandInDriver(states={100: RUNNING})
    nvml = StandInNvml(driver, {GPU: 80 * GIB})
    nvml.used[GPU] = {100: 3 * GIB}
    monkeypatch.setattr(cuda_mod, "load_modules", lambda: (driver, nvml))
    monkeypatch.setattr(cuda_mod, "bindings_version", lambda: "13.0.3")
    yield driver
    driver.hang_over.set()


def parked_with(**flags: float) -> StandInDriver:
    """Park and restore one tenant with a cuda backend built from `flags`."""
    backend, _ = build_backend(ParkingOptions(backend="cuda", **flags))  # type: ignore[arg-type]
    driver = backend.driver  # type: ignore[attr-defined]
    backend.attach(TenantRef("a", (GPU,), pids=(100,)))
    assert backend.park("a", GPU).bytes == 3 * GIB
    assert driver.states[100] == CHECKPOINTED
    assert backend.restore("a", GPU).bytes == 3 * GIB
    assert driver.states[100] == RUNNING
    return driver


@pytest.mark.parametrize(("seconds", "ms"), [(5.0, 5000), (0.0004, 1), (1.0005, 1001)])
def test_the_move_timeout_reaches_the_lock_in_milliseconds_never_0(driver, seconds, ms):
    """0 ms is the driver's "no timeout": a timeout under a millisecond must not become it."""
    assert parked_with(lock_timeout_s=seconds).lock_timeouts == [ms]


@pytest.mark.parametrize("seconds", [math.inf, 5e6])
def test_a_move_timeout_the_lock_cannot_hold_is_refused_at_start(driver, seconds):
    with pytest.raises(BackendUnavailable, match=r"--move-timeout .*at most 4294967 s"):
        build_backend(ParkingOptions(backend="cuda", lock_timeout_s=seconds))


class CallStillRunning(threading.Event):
    """The deadline's event as a real driver call meets it: still running when the caller
    waits, so the wait's bound is checked (Python refuses one past `threading.TIMEOUT_MAX`)."""

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None and timeout > threading.TIMEOUT_MAX:
            raise OverflowError("timeout value is too large")
        return super().wait(timeout)


@pytest.mark.parametrize(
    "flags", [{"driver_call_timeout_s": math.inf}, {"slowest_copy_gbps": 1e-12}]
)
def test_deadlines_past_what_a_thread_can_wait_do_not_break_the_calls(driver, monkeypatch, flags):
    waits = SimpleNamespace(
        Event=CallStillRunning, Thread=threading.Thread, TIMEOUT_MAX=threading.TIMEOUT_MAX
    )
    monkeypatch.setattr(deadline, "threading", waits)
    parked_with(**flags)

"""A daemon's stop: every part stops in order, a failing part does not keep the rest running,
and a slow one is named in the log."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys

import pytest

from baton.contract import shutdown
from baton.contract.shutdown import StopSignal


def test_every_part_stops_in_order_and_a_failure_is_said_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stopped: list[str] = []

    def broken() -> None:
        stopped.append("b")
        raise OSError("socket already gone")

    parts = [("a", lambda: stopped.append("a")), ("b", broken), ("c", lambda: stopped.append("c"))]
    with caplog.at_level(logging.WARNING, logger=shutdown.__name__):
        shutdown.stop_parts("test daemon", parts, slow_s=60)
    assert stopped == ["a", "b", "c"]
    assert [r.getMessage() for r in caplog.records] == [
        "test daemon: stopping b failed: socket already gone"
    ]


def test_a_part_slower_than_the_bound_is_named(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=shutdown.__name__):
        shutdown.stop_parts("test daemon", [("quick", lambda: None), ("slow", lambda: None)], -1)
    said = [r.getMessage() for r in caplog.records]
    assert said[0].startswith("test daemon: stopping quick took ") and said[0].endswith(" s")
    assert said[1].startswith("test daemon: stopping slow took ")


STOPPED_BY_A_SIGNAL_ANOTHER_THREAD_TOOK = """
import signal, threading
from baton.contract import shutdown
from baton.contract.shutdown import StopSignal

stop = shutdown.StopSignal().install()
ready = threading.Event()

def worker() -> None:
    ready.wait()
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # as the kernel may deliver it
    threading.Event().wait(60)  # a daemon's worker goes on with its own work

threading.Thread(target=worker, daemon=True).start()
shutdown.run_until(ready.set, lambda: print("stopped on", stop.received), stop.event)
"""


def test_a_stop_signal_taken_by_another_thread_still_stops_the_daemon() -> None:
    # The kernel hands a process's SIGTERM to any of its threads. Python runs the handler on
    # the main thread, but only once that thread runs again: blocked in a wait with no
    # timeout, it never would, and the daemon outlived its pod's grace.
    done = subprocess.run(
        [sys.executable, "-c", STOPPED_BY_A_SIGNAL_ANOTHER_THREAD_TOOK],
        capture_output=True,
        text=True,
        timeout=15,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped on SIGTERM"


def test_a_second_stop_signal_during_a_caught_start_goes_to_the_handlers_found() -> None:
    """The first signal during a start is noted (it stops in order once it can); a second one
    is not only noted, so a start that hangs can still be interrupted (here Ctrl-C's
    KeyboardInterrupt), and the handlers found are given back."""
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)  # (`&` ignores it)
    try:
        with pytest.raises(KeyboardInterrupt), StopSignal().caught() as early:
            signal.raise_signal(signal.SIGINT)
            assert early.received == "SIGINT"
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, inherited)

"""A daemon's stop: every part stops in order, a failing part does not keep the rest running,
and a slow one is named in the log."""

from __future__ import annotations

import logging

import pytest

from baton.contract import shutdown


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

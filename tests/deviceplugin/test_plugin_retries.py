"""A plugin directory the plugin cannot serve in (its socket cannot be bound there) is tried
again with backoff, said once: it was tried every 0.1 s forever, two warnings each time."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from deviceplugin import plugin as plugin_module
from deviceplugin.plugin import RETRY_FIRST_S, RETRY_MAX_S, DevicePlugin

TRIES = 8


class CountedStop(threading.Event):
    """The plugin's stop: records each wait's delay, makes the kubelet's directory `appears` in
    the first, and is set after `TRIES` waits."""

    def __init__(self, appears: Path) -> None:
        super().__init__()
        self.appears = appears
        self.delays: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.appears.mkdir(exist_ok=True)
        self.delays.append(timeout or 0.0)
        if len(self.delays) >= TRIES:
            self.set()
        return self.is_set()


def test_a_directory_it_cannot_serve_in_is_retried_with_backoff_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plugin_dir = tmp_path / "device-plugins"  # created after the plugin started
    server = SimpleNamespace(service=SimpleNamespace(), stop=lambda: None)
    plugin = DevicePlugin(cast(Any, server), plugin_dir, cast(Any, None))
    stop = CountedStop(plugin_dir)
    plugin._stop = stop

    def unbindable() -> None:
        raise OSError("AF_UNIX path too long")

    plugin._open = unbindable  # type: ignore[method-assign]
    with caplog.at_level(logging.DEBUG, logger=plugin_module.__name__):
        plugin._run()
    assert stop.delays == [min(RETRY_FIRST_S * 2**i, RETRY_MAX_S) for i in range(TRIES)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [
        f"{plugin_dir}: the device-plugin directory does not exist (yet); waiting for the "
        f"kubelet to create it (checking every {RETRY_FIRST_S:g} to {RETRY_MAX_S:g} s), then "
        "serving and registering",
        f"{plugin_dir}: cannot serve in it (AF_UNIX path too long); trying again up to "
        f"{RETRY_MAX_S:g} s apart",
    ]

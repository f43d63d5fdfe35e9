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
from deviceplugin.watcher import Change

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


class ScriptedWatcher:
    """The directory's changes, one list per wait, as scripted; the plugin is stopped after."""

    def __init__(self, plugin: DevicePlugin, script: list[list[Change]]) -> None:
        self.plugin = plugin
        self.script = script

    def changes(self, timeout: float | None = None) -> list[Change]:
        if not self.script:
            self.plugin._stop.set()
            return []
        return self.script.pop(0)


def test_a_failing_restart_is_said_once_per_reason_without_a_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each retry of a failed restart logged the same warning with a full traceback (every few
    seconds while the socket could not be served): an operator's log filled with them."""
    socket_path = tmp_path / "baton.sock"  # never there: a restart's start fails or does nothing
    full = f"cannot bind plugin socket {socket_path}: No space left on device"
    starts: list[Exception | None] = [
        *[OSError(full)] * 4,  # the restart for the deleted socket, then 3 retries
        RuntimeError("grpc server would not start"),
        RuntimeError("grpc server would not start"),
        None,  # it works: what fails after is a new episode, said again
        OSError(full),
    ]

    def start() -> None:
        failure = starts.pop(0)
        if failure is not None:
            raise failure

    server = SimpleNamespace(
        service=SimpleNamespace(), socket_path=socket_path, start=start, stop=lambda: None
    )
    plugin = DevicePlugin(cast(Any, server), tmp_path, cast(Any, None))
    deleted = [Change.PLUGIN_SOCKET_DELETED]
    watcher = ScriptedWatcher(plugin, [deleted, [], [], [], [], [], [], deleted])
    plugin._watcher = cast(Any, watcher)
    with caplog.at_level(logging.DEBUG, logger=plugin_module.__name__):
        plugin._watch()
    assert starts == [] and watcher.script == []
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO]
    restart = f"{socket_path} was deleted: restarting the plugin server and registering again"
    failed = (
        "restarting the plugin server failed ({}); retrying up to " + f"{RETRY_MAX_S:g} s apart"
    )
    assert said == [
        ("INFO", restart),
        ("WARNING", failed.format(full)),
        ("WARNING", failed.format("RuntimeError: grpc server would not start")),
        ("INFO", restart),
        ("WARNING", failed.format(full)),
    ]
    assert not any(r.exc_info for r in caplog.records if r.levelno >= logging.INFO)
    repeats = [r for r in caplog.records if r.getMessage() == failed.format(full)]
    assert [r.levelname for r in repeats] == ["WARNING", "DEBUG", "DEBUG", "DEBUG", "WARNING"]


def test_the_start_line_does_not_say_serving_while_the_kubelets_directory_is_missing(
    socket_dir: Path, start_plugin: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """With the kubelet's directory not there yet, the start logged "serving 8 slot devices of
    baton.dev/gpu on DIR/baton-gpu.sock" right after the warning that it waits for it: an
    operator looking why the kubelet has no baton.dev/gpu read that the socket was served."""
    plugin_dir = socket_dir / "not-yet"
    with caplog.at_level(logging.INFO, logger="deviceplugin.daemon"):
        daemon = start_plugin(plugin_dir=plugin_dir)
    started = [r.getMessage() for r in caplog.records if "slot devices of" in r.getMessage()]
    assert len(started) == 1 and started[0].startswith("will serve 8 slot devices"), started
    assert "once the kubelet creates its directory" in started[0]
    assert not daemon.plugin.serving

"""The driver's sockets: directories that are files, paths too long for a unix socket, and a
stopping driver beside a new one that took its sockets."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from baton.contract import names, shutdown
from baton.contract.unixsocket import identity
from dra.daemon import DraStartError, Driver
from dra.server import DriverServer, endpoint_path, registration_path
from tests.dra.test_driver import GPUS, Claims, _settings, _start, tmp
from tests.dra.test_slices import Slices
from tests.harness.drakubelet import DraKubeletStub

__all__ = ["tmp"]  # the fixture, used by name


@pytest.mark.parametrize("flag", ["plugins_dir", "registry_dir"])
def test_a_socket_directory_that_is_a_file_is_refused_naming_the_flags(
    tmp: Path, flag: str
) -> None:
    """A driver that cannot serve its sockets is refused naming both flags, and publishes no
    ResourceSlice: it published the node's GPUs before it served, so a driver that never
    started left a slice the scheduler allocated claims from, their pods sent to a node whose
    kubelet had no driver to prepare them."""
    blocker = tmp / "a-file"
    blocker.write_text("not a directory")
    changed: dict[str, Any] = {flag: blocker}
    settings = dataclasses.replace(_settings(tmp), **changed)
    slices = Slices()
    driver = Driver(settings, GPUS, True, slices=slices, claims=Claims())
    with pytest.raises(DraStartError, match=r"--plugins-dir .* --registry-dir") as refused:
        shutdown.run_until(driver.start, driver.stop, threading.Event())
    assert str(blocker) in str(refused.value)
    assert slices.calls == [], "no slice published by a driver that did not start"


def _dir_of_length(tmp: Path, socket: Callable[[Path], Path], length: int) -> Path:
    """A directory under `tmp` in which `socket` (the driver's socket in it) is `length` bytes."""
    short = tmp / "d"
    made = tmp / ("d" * (length - len(bytes(socket(short))) + 1))
    assert len(bytes(socket(made))) == length
    return made


@pytest.mark.parametrize(
    ("flag", "socket", "option"),
    [
        ("plugins_dir", endpoint_path, "--plugins-dir (BATON_DRA_PLUGINS_DIR)"),
        ("registry_dir", registration_path, "--registry-dir (BATON_DRA_REGISTRY_DIR)"),
    ],
    ids=["plugins-dir", "registry-dir"],
)
def test_a_socket_path_too_long_for_a_unix_socket_is_refused_before_anything_starts(
    tmp: Path, flag: str, socket: Callable[[Path], Path], option: str
) -> None:
    """A socket of the most bytes a unix socket's path has is served; one byte more is refused
    naming its flag, before the driver makes its directories or starts its node layer (it
    was refused only at the bind, after both, naming both flags)."""
    fits: dict[str, Any] = {flag: _dir_of_length(tmp, socket, 107)}
    driver = Driver(
        dataclasses.replace(_settings(tmp), **fits), GPUS, True, slices=Slices(), claims=Claims()
    )
    try:
        driver.start()
        assert socket(fits[flag]).is_socket()
    finally:
        driver.stop()
    deep = _dir_of_length(tmp / "new", socket, 108)
    too_long: dict[str, Any] = {flag: deep}
    settings = dataclasses.replace(_settings(tmp / "new"), **too_long)
    with pytest.raises(DraStartError) as refused:
        Driver(settings, GPUS, True, slices=Slices(), claims=Claims())
    assert str(refused.value) == (
        f"the socket {socket(deep)} is 108 bytes, over the 107 a unix socket's path may have: "
        f"pass a shorter {option}"
    )
    assert not (tmp / "new").exists(), "nothing made"


def test_a_socket_too_long_to_bind_is_named_once_with_its_length(tmp: Path) -> None:
    """Past the driver's own start-up check (a server given its path directly), the bind's
    error names the path once, then its length against the limit (it named it twice)."""
    driver = _start(tmp, Claims(), Slices())
    deep = endpoint_path(tmp / ("d" * 110))
    parts = driver.server
    server = DriverServer(parts.plugin, parts.health, parts.registration, deep, deep)
    try:
        with pytest.raises(OSError) as refused:
            server.start()
    finally:
        driver.stop()
    assert str(refused.value) == (
        f"cannot bind socket {deep}: it is {len(bytes(deep))} bytes, over the 107 a unix "
        "socket's path may have"
    )


def test_a_driver_stopping_after_a_new_driver_took_its_sockets_leaves_the_new_ones(
    tmp: Path,
) -> None:
    """The kubelet wiped its plugin directories and a new driver pod started while the old one
    was still stopping: the old one's stop removed the new driver's sockets (gRPC removes the
    path it bound), and the kubelet deregistered the driver that serves."""
    claims, slices = Claims(), Slices()
    settings = dataclasses.replace(_settings(tmp), state_dir=tmp / "new", cdi_dir=tmp / "new-cdi")
    old = _start(tmp, claims, slices)
    new = Driver(settings, GPUS, True, slices=slices, claims=claims)
    kubelet = DraKubeletStub(tmp / "plugins_registry")
    sockets = (old.server.endpoint, old.server.registration_socket)
    try:
        for path in sockets:
            path.unlink()
        new.start()
        made = [identity(p) for p in sockets]
        old.stop()
        assert [identity(p) for p in sockets] == made
        kubelet.register()
        claims.add("ns", "c1", "uid-1", "gpu-0")
        assert kubelet.prepare(("ns", "uid-1", "c1")).claims["uid-1"].error == ""
    finally:
        kubelet.close()
        new.stop()
        old.stop()  # again, when the test failed before
    assert [p.name for d in (tmp / "plugins", tmp / "plugins_registry") for p in d.rglob("*")] == [
        names.DRA_DRIVER
    ], "no socket left, a private one included"

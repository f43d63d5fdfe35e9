"""The plugin's socket in the kubelet's directory: a plugin that stops removes its socket only
while it is its own, never one a newer plugin put in its place."""

from __future__ import annotations

from pathlib import Path

import pytest

from baton.contract import names
from baton.contract.unixsocket import identity
from deviceplugin.server import PluginServer
from tests.deviceplugin.conftest import StartPlugin
from tests.harness.kubelet import PluginEndpoint


def test_a_plugin_stopping_after_a_new_plugin_took_its_socket_leaves_the_new_one(
    socket_dir: Path, start_plugin: StartPlugin
) -> None:
    """A new plugin pod started while the old one still ran (a rollout with surge) puts its
    socket in the old one's place; the old one's stop removed it (gRPC removes the path it
    bound), and the kubelet could no longer reach the plugin that serves."""
    path = socket_dir / names.DEVICE_PLUGIN_SOCKET_NAME
    old = start_plugin()
    new = start_plugin()
    made = identity(path)
    old.stop()
    assert identity(path) == made
    kubelet = PluginEndpoint(path, names.RESOURCE_GPU)
    try:
        assert len(kubelet.wait_for_list(bool)) == 8
    finally:
        kubelet.stop()
    new.stop()
    assert list(socket_dir.iterdir()) == [], "no socket left, a private one included"


def test_a_plugin_socket_too_long_to_bind_is_named_once_with_its_length(
    socket_dir: Path, start_plugin: StartPlugin
) -> None:
    """Past the daemon's own start-up check (a server given its path directly), the bind's
    error names the path once, then its length against the limit (it named it twice)."""
    plugin = start_plugin()
    deep = socket_dir / ("d" * 110) / names.DEVICE_PLUGIN_SOCKET_NAME
    server = PluginServer(plugin.plugin.server.service, deep)
    with pytest.raises(OSError) as refused:
        server.start()
    assert str(refused.value) == (
        f"cannot bind plugin socket {deep}: it is {len(bytes(deep))} bytes, over the 107 a unix "
        "socket's path may have"
    )

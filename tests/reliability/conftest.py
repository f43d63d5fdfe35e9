"""The device plugin's fixtures (kubelet stub, plugin daemon), shared with the kubelet faults."""

from tests.deviceplugin.conftest import kubelet, socket_dir, start_plugin

__all__ = ["kubelet", "socket_dir", "start_plugin"]

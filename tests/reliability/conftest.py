"""Fixtures of the device plugin (kubelet stub, plugin daemon) and of the extender (fake API
server, its client, a watching cache), shared with the fault tests here."""

from tests.deviceplugin.conftest import kubelet, socket_dir, start_plugin
from tests.extender.conftest import api_client, fake_api, kube_cache, restarts

__all__ = [
    "api_client", "fake_api", "kube_cache", "kubelet", "restarts", "socket_dir", "start_plugin",
]  # fmt: skip

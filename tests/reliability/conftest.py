"""Fixtures of the device plugin (kubelet stub, plugin daemon) and of the extender (a watching
cache), shared with the fault tests here; the fake API server and its client come from
tests/conftest.py."""

from tests.deviceplugin.conftest import kubelet, socket_dir, start_plugin
from tests.extender.conftest import kube_cache, restarts

__all__ = ["kube_cache", "kubelet", "restarts", "socket_dir", "start_plugin"]

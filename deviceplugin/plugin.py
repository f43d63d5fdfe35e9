"""The plugin's lifecycle: serve, register, and serve + register again when the kubelet restarts."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from baton import names
from deviceplugin.metrics import Metrics
from deviceplugin.registration import RegistrationError, register
from deviceplugin.server import PluginServer
from deviceplugin.watcher import Change, SocketWatcher

log = logging.getLogger(__name__)
RETRY_FIRST_S = 0.1
RETRY_MAX_S = 5.0


class DevicePlugin:
    """Owns the plugin's socket server and its registration with the kubelet."""

    def __init__(self, server: PluginServer, plugin_dir: Path, metrics: Metrics) -> None:
        self.server = server
        self.plugin_dir = plugin_dir
        self.metrics = metrics
        self.kubelet_socket = plugin_dir / names.KUBELET_SOCKET_NAME
        self.registered = False
        self._retry_s = RETRY_FIRST_S
        self._stop = threading.Event()
        self._watcher = SocketWatcher(
            plugin_dir, names.KUBELET_SOCKET_NAME, server.socket_path.name
        )
        self._thread = threading.Thread(target=self._watch, name="kubelet-watch", daemon=True)

    def start(self) -> None:
        """Serve, register (retried in the background if the kubelet is not there yet), watch."""
        self.server.start()
        self._register()
        self._thread.start()

    def stop(self, grace: float | None = None) -> None:
        """Stop watching and serving (in-flight calls get `grace` s); the kubelet sees it go."""
        self._stop.set()
        self._watcher.wake()
        self._thread.join(timeout=10)
        self._watcher.close()
        self.server.stop(grace)

    def _register(self) -> None:
        try:
            register(self.kubelet_socket, self.server.socket_path.name, names.RESOURCE_GPU)
        except RegistrationError as err:
            self.registered = False
            self.metrics.registrations.labels(outcome="failed").inc()
            log.warning(
                "not registered: %s; retrying in %g s or when kubelet.sock appears",
                err,
                self._retry_s,
            )
            return
        self.registered = True
        self._retry_s = RETRY_FIRST_S
        self.metrics.registrations.labels(outcome="ok").inc()
        log.info("registered %s with the kubelet at %s", names.RESOURCE_GPU, self.kubelet_socket)

    def _restart(self, why: str) -> None:
        log.info("%s: restarting the plugin server and registering again", why)
        self.server.stop()
        self.server.start()
        if self.kubelet_socket.exists():
            self._register()
        else:
            self.registered = False

    def _watch(self) -> None:
        broken = False
        while not self._stop.is_set():
            waiting = not self.registered or broken
            changes = list(self._watcher.changes(self._retry_s if waiting else None))
            if waiting and not changes:
                self._retry_s = min(self._retry_s * 2, RETRY_MAX_S)
            if self._stop.is_set():
                return
            if Change.DIRECTORY_GONE in changes:
                log.error("%s disappeared: the kubelet cannot reach this plugin", self.plugin_dir)
                return
            try:
                broken = self._react(changes, broken)
            except Exception:
                log.exception("restarting the plugin server failed; retrying")
                broken = True

    def _react(self, changes: list[Change], broken: bool) -> bool:
        """Restart or register as the changes require; False once all is well again."""
        if Change.KUBELET_SOCKET_CREATED in changes:
            self._restart("kubelet.sock was created (kubelet restarted)")
        elif Change.PLUGIN_SOCKET_DELETED in changes and not self.server.socket_path.exists():
            self._restart(f"{self.server.socket_path} was deleted")
        elif not changes and broken:
            self._restart("retrying after a failed restart")
        elif not changes and not self.registered and self.kubelet_socket.exists():
            self._register()
        return False

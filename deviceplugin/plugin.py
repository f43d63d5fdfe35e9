"""The plugin's lifecycle: serve, register, and serve + register again when the kubelet restarts."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from baton.contract import names
from deviceplugin.errors import DevicePluginStartError
from deviceplugin.registration import RegistrationError, register
from deviceplugin.server import PluginServer
from deviceplugin.watcher import Change, SocketWatcher
from nodegpu.metrics import Metrics

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
        self._registered_with: tuple[int, int] | None = None
        """The kubelet.sock (inode, ctime) the last registration went to."""
        self._stream_lost = threading.Event()
        server.service.stream_ended = self._on_stream_end
        self._retry_s = RETRY_FIRST_S
        self._failed_registrations = 0
        """Failed attempts since the last registration: only the first is a warning."""
        self._stop = threading.Event()
        self._watcher: SocketWatcher | None = None
        self._thread = threading.Thread(target=self._run, name="kubelet-watch", daemon=True)

    def start(self) -> None:
        """Serve, register (retried in the background if the kubelet is not there yet), watch;
        all in the background while the kubelet's directory does not exist yet."""
        if self.plugin_dir.exists() and not self.plugin_dir.is_dir():
            raise DevicePluginStartError(
                f"{self.plugin_dir} is not a directory: pass the kubelet's device-plugin "
                "directory as --device-plugin-dir (BATON_DEVICE_PLUGIN_DIR)"
            )
        if self.plugin_dir.is_dir():
            try:
                self._open()
            except OSError as err:
                raise DevicePluginStartError(
                    f"cannot serve the plugin socket in {self.plugin_dir} ({err}); the plugin "
                    "needs to create sockets there (run it as root, with the directory mounted)"
                ) from None
        self._thread.start()

    @property
    def serving(self) -> bool:
        """Whether its socket is served: the kubelet's directory was there to serve in."""
        return self._watcher is not None

    def stop(self, grace: float | None = None) -> None:
        """Stop watching and serving (in-flight calls get `grace` s); the kubelet sees it go."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.wake()
        if self._thread.ident is not None:
            self._thread.join(timeout=10)
        if self._watcher is not None:
            self._watcher.close()
        self.server.stop(grace)

    def _open(self) -> None:
        """Watch the directory, serve in it and register."""
        self._watcher = SocketWatcher(
            self.plugin_dir, names.KUBELET_SOCKET_NAME, self.server.socket_path.name
        )
        self.server.start()
        self._register()

    def _wait_for_directory(self, why: str, delay: float = RETRY_FIRST_S) -> bool:
        """Wait (with backoff from `delay`, until stopped) for the kubelet to create its
        directory; said at the first wait only (`delay` is longer after a failed open)."""
        if delay == RETRY_FIRST_S:
            log.warning(
                "%s: %s; waiting for the kubelet to create it (checking every %g to %g s), "
                "then serving and registering",
                self.plugin_dir,
                why,
                RETRY_FIRST_S,
                RETRY_MAX_S,
            )
        while not self._stop.wait(delay):
            if self.plugin_dir.is_dir():
                log.info("%s exists now", self.plugin_dir)
                return True
            delay = min(delay * 2, RETRY_MAX_S)
        return False

    def _run(self) -> None:
        """Watch the directory; wait for it while it is missing, before and after a start."""
        why = "the device-plugin directory does not exist (yet)"
        failed = 0  # opens that failed in a row: retried with backoff, said once
        while not self._stop.is_set():
            if self._watcher is None:
                delay = min(RETRY_FIRST_S * 2 ** min(failed, 16), RETRY_MAX_S)
                if not self._wait_for_directory(why, delay):
                    return
                try:
                    self._open()
                except OSError as err:  # gone again before the watch was set up, or unbindable
                    failed += 1
                    log.log(
                        logging.WARNING if failed == 1 else logging.DEBUG,
                        "%s: cannot serve in it (%s); trying again up to %g s apart",
                        self.plugin_dir,
                        err.strerror or err,
                        RETRY_MAX_S,
                    )
                    self._close_watcher()
                    continue
                failed = 0
            self._watch()
            why = "the directory disappeared, so the kubelet cannot reach this plugin"

    def _close_watcher(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
        self.server.stop()
        self.registered = False

    def _register(self) -> None:
        # Streams that ended before this registration say nothing of it; one that ends from
        # here on may be its own, ended by the kubelet before the call below returns.
        self._stream_lost.clear()
        try:
            register(self.kubelet_socket, self.server.socket_path.name, names.RESOURCE_GPU)
        except RegistrationError as err:
            self.registered = False
            self.metrics.registrations.labels(outcome="failed").inc()
            self._failed_registrations += 1
            log.log(
                logging.WARNING if self._failed_registrations == 1 else logging.DEBUG,
                "not registered: %s; retrying with backoff (next in %g s, up to %g s apart) "
                "and when kubelet.sock appears",
                err,
                self._retry_s,
                RETRY_MAX_S,
            )
            return
        self._failed_registrations = 0
        self.registered = True
        # After, not before: a registration reaches whichever kubelet serves kubelet.sock when
        # it connects, and a new kubelet may have replaced the socket since it was last seen.
        # Taken before, a socket the new kubelet created meanwhile would look like a later
        # kubelet's and restart the server, ending the stream that kubelet just opened; the
        # kubelet then disconnects that client late, marking the registration after it
        # unhealthy (capacity 8, allocatable 0). Were a third kubelet to replace the socket
        # during the call, the one registered with dies and its stream's end registers again.
        self._registered_with = _identity(self.kubelet_socket)
        self._retry_s = RETRY_FIRST_S
        self.metrics.registrations.labels(outcome="ok").inc()
        log.info("registered %s with the kubelet at %s", names.RESOURCE_GPU, self.kubelet_socket)

    def _restart(self, why: str, level: int = logging.INFO) -> None:
        log.log(level, "%s: restarting the plugin server and registering again", why)
        self.server.stop()
        self.server.start()
        if self.kubelet_socket.exists():
            self._register()
        else:
            self.registered = False

    def _watch(self) -> None:
        """React to the directory's changes until stopped or the directory is gone."""
        assert self._watcher is not None
        broken = False
        failure = ""  # why the last restart failed: said once, until one works or it changes
        while not self._stop.is_set():
            waiting = not self.registered or broken
            changes = list(self._watcher.changes(self._retry_s if waiting else None))
            if waiting and not changes:
                self._retry_s = min(self._retry_s * 2, RETRY_MAX_S)
            if self._stop.is_set():
                return
            if Change.DIRECTORY_GONE in changes:
                self._close_watcher()
                return
            try:
                broken = self._react(changes, broken)
            except Exception as err:
                reason = _reason(err)
                log.log(
                    logging.DEBUG if reason == failure else logging.WARNING,
                    "restarting the plugin server failed (%s); retrying up to %g s apart",
                    reason,
                    RETRY_MAX_S,
                )
                if reason != failure:
                    log.debug("the failed restart", exc_info=True)
                failure, broken = reason, True
            else:
                failure = ""

    def _on_stream_end(self) -> None:
        """A gRPC thread: the kubelet ended a ListAndWatch stream; the watch loop decides."""
        self._stream_lost.set()
        watcher = self._watcher  # read once: the watch thread may replace or close it
        if watcher is not None:
            watcher.wake()  # a closed watcher ignores it

    def _react(self, changes: list[Change], broken: bool) -> bool:
        """Restart or register as the changes require; False once all is well again."""
        created = Change.KUBELET_SOCKET_CREATED in changes
        if created and self._serving_this_kubelet():
            # Nothing to restart; a stream's end in the same batch is still seen below.
            log.info("kubelet.sock was created, and this plugin is already registered there")
            created = False
        if created:
            self._restart("kubelet.sock was created (kubelet restarted)")
        elif Change.EVENTS_LOST in changes and not self._serving_this_kubelet():
            # The dropped events may have been a kubelet's restart (its kubelet.sock created,
            # this plugin's socket deleted): the sockets there now say it was.
            self._restart(
                f"inotify events on {self.plugin_dir} were lost (queue overflow), and this "
                "plugin is not serving the kubelet.sock there now",
                logging.WARNING,
            )
        elif Change.PLUGIN_SOCKET_DELETED in changes and not self.server.socket_path.exists():
            self._restart(f"{self.server.socket_path} was deleted")
        elif not changes and broken:
            self._restart("retrying after a failed restart", logging.DEBUG)  # said at failure
        elif self._stream_lost.is_set():
            self._stream_lost.clear()
            if self.registered and self.server.service.streams == 0:
                # The kubelet drops a registration this way when an older one's stream ends
                # after it (its device manager disconnects the resource's current client).
                log.warning(
                    "the kubelet closed this plugin's ListAndWatch stream: registering again "
                    "in %g s",
                    self._retry_s,
                )
                self.registered = False
        elif not changes and not self.registered and self.kubelet_socket.exists():
            self._register()
        return False

    def _serving_this_kubelet(self) -> bool:
        """Registered with the kubelet.sock there now, and serving: nothing to restart."""
        return (
            self.registered
            and self.server.socket_path.exists()
            and self._registered_with is not None
            and self._registered_with == _identity(self.kubelet_socket)
        )


def _reason(err: Exception) -> str:
    """A failure's one-line reason: an OSError's message (the server's name the socket and
    why), else the exception's type and message."""
    if isinstance(err, OSError) and str(err):
        return str(err)
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


def _identity(path: Path) -> tuple[int, int] | None:
    """A file's (inode, ctime in ns): a socket created anew differs; None when absent."""
    try:
        found = path.stat()
    except OSError:
        return None
    return (found.st_ino, found.st_ctime_ns)

"""Serving the app with uvicorn on a socket bound before the server starts."""

from __future__ import annotations

import contextlib
import math
import signal
import socket
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import uvicorn

from baton.shutdown import STOP_SIGNALS, signal_name


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket; connections queue in its backlog until the server accepts.

    Its protocol is set to TCP explicitly: asyncio turns Nagle off only on accepted sockets whose
    protocol says TCP, and without that every answer waits out the client's delayed ACK.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


class Server(uvicorn.Server):
    """uvicorn, except that a stop signal ends `run` normally instead of being raised again."""

    stop_signal: str | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Catch SIGTERM and SIGINT while serving from the main thread."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self._on_stop_signal) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_stop_signal(self, sig: int, frame: FrameType | None) -> None:
        self.stop_signal = self.stop_signal or signal_name(sig)
        self.handle_exit(sig, frame)


def make_server(
    app: Any,
    certfile: str | None = None,
    keyfile: str | None = None,
    shutdown_grace: float | None = None,
) -> Server:
    """A uvicorn server for the app, with TLS when a certificate and key are given.

    On stop it accepts no new connections and gives open ones `shutdown_grace` (whole) seconds.
    """
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        ssl_certfile=certfile,
        ssl_keyfile=keyfile,
        timeout_graceful_shutdown=None if shutdown_grace is None else math.ceil(shutdown_grace),
    )
    return Server(config)


class ServerThread:
    """The app served from a background thread; `port` is usable as soon as it is constructed."""

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        certfile: str | None = None,
        keyfile: str | None = None,
    ):
        self._socket = bind_socket(host, port)
        self.port = int(self._socket.getsockname()[1])
        self.server = make_server(app, certfile, keyfile)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._socket]}, name="extender-http"
        )
        self._thread.daemon = True

    def start(self) -> ServerThread:
        """Start serving."""
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the server to finish and wait (bounded) for it."""
        self.server.should_exit = True
        self._thread.join(timeout_s)
        self._socket.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""Serving the app with uvicorn on a socket bound before the server starts."""

from __future__ import annotations

import socket
import threading
from typing import Any

import uvicorn


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


def make_server(
    app: Any, certfile: str | None = None, keyfile: str | None = None
) -> uvicorn.Server:
    """A uvicorn server for the app, with TLS when a certificate and key are given."""
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        ssl_certfile=certfile,
        ssl_keyfile=keyfile,
    )
    return uvicorn.Server(config)


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

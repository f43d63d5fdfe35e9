"""Serving the extender's routes on a socket bound before the server starts.

The event loop is uvloop's (libuv, in C): the extender's answers are short, so the loop's own
work per request (waking on the socket, reading, writing, scheduling callbacks) is a large part
of what each costs.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
from collections.abc import Callable
from types import FrameType

import uvloop

from baton.contract.shutdown import STOP_SIGNALS, signal_name
from extender.http import HttpServer, Routes
from extender.tlsfiles import CHECK_EVERY_S, TlsFiles


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket; connections queue in its backlog until the server accepts."""
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


class Server:
    """The routes served from `run` until `stop()` or (in the main thread) SIGTERM/SIGINT.

    On stop it accepts no new connections and gives open requests `shutdown_grace` seconds.
    """

    def __init__(
        self,
        routes: Routes,
        certfile: str | None = None,
        keyfile: str | None = None,
        shutdown_grace: float | None = None,
        on_stop: Callable[[], None] | None = None,
        client_ca: str | None = None,
    ):
        """`on_stop` runs on the server's event loop once it has stopped serving (e.g. to
        close connections made on that loop); `client_ca` (with TLS): see `extender.tlsfiles`."""
        self.tls = TlsFiles(certfile, keyfile, client_ca) if certfile and keyfile else None
        """The TLS files served, loaded again as they change (None: plain HTTP)."""
        self.http = HttpServer(routes, self.tls.context if self.tls else None)
        self.shutdown_grace = shutdown_grace
        self._on_stop = on_stop
        self.stop_signal: str | None = None
        """The signal that stopped it, by name; None when stopped by `stop()` or not yet."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stop_asked = threading.Event()
        self._ready = threading.Event()
        self._checking: asyncio.TimerHandle | None = None

    def run(self, sockets: list[socket.socket]) -> None:
        """Serve on the (listening) socket until stopped."""
        (sock,) = sockets
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(self._serve(sock))

    async def _serve(self, sock: socket.socket) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        main = threading.current_thread() is threading.main_thread()
        found = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} if main else {}
        for sig in found:
            self._loop.add_signal_handler(sig, self._on_stop_signal, sig)
        self._ready.set()
        if self._stop_asked.is_set() or self.stop_signal is not None:
            self._stop.set()
        if self.tls is not None:
            self._checking = self._loop.call_later(CHECK_EVERY_S, self._check_tls)
        try:
            await self.http.serve(sock, self._stop, self.shutdown_grace)
        finally:
            if self._checking is not None:
                self._checking.cancel()
            if self._on_stop is not None:
                self._on_stop()
            for sig, handler in found.items():  # not the default's: the caller still stops
                self._loop.remove_signal_handler(sig)
                if handler is not None:  # e.g. `catch_stop_signals`': one more is only noted
                    signal.signal(sig, handler)

    def _check_tls(self) -> None:
        """Serve changed TLS files from the next handshake on; look again later."""
        assert self.tls is not None and self._loop is not None
        self.tls.check()
        self._checking = self._loop.call_later(CHECK_EVERY_S, self._check_tls)

    def catch_stop_signals(self) -> None:
        """From now on (call it in the main thread), SIGTERM or SIGINT stops the server, also
        one that arrives before `run` serves: it then stops as soon as it starts. While `run`
        serves, its event loop handles them; once it returns, one more is only noted, so that
        the caller stops the rest in order."""
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_early_signal)

    def _on_early_signal(self, sig: int, _frame: FrameType | None) -> None:
        # Only an attribute: a handler that took a lock could interrupt its own holder.
        self.stop_signal = self.stop_signal or signal_name(sig)

    def _on_stop_signal(self, sig: int) -> None:
        self.stop_signal = self.stop_signal or signal_name(sig)
        self.stop()

    def stop(self) -> None:
        """Ask the server to stop (from any thread)."""
        self._stop_asked.set()
        if self._ready.is_set() and self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # its loop has finished: nothing to stop
                self._loop.call_soon_threadsafe(self._stop.set)


class ServerThread:
    """The routes served from a background thread; `port` is usable as soon as it is
    constructed."""

    def __init__(
        self,
        routes: Routes,
        host: str = "127.0.0.1",
        port: int = 0,
        certfile: str | None = None,
        keyfile: str | None = None,
        on_stop: Callable[[], None] | None = None,
        client_ca: str | None = None,
    ):
        self._socket = bind_socket(host, port)
        self.port = int(self._socket.getsockname()[1])
        self.server = Server(
            routes, certfile, keyfile, shutdown_grace=1.0, on_stop=on_stop, client_ca=client_ca
        )
        self._thread = threading.Thread(
            target=self.server.run, args=([self._socket],), name="extender-http"
        )
        self._thread.daemon = True

    def start(self) -> ServerThread:
        """Start serving."""
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the server to finish and wait (bounded) for it."""
        self.server.stop()
        self._thread.join(timeout_s)
        self._socket.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

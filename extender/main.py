"""Wiring for `baton extender`: API client, cache, binder, app, server."""

from __future__ import annotations

import errno
import logging
import time
from dataclasses import dataclass

from baton.contract.shutdown import DEFAULT_GRACE_S
from extender.bind import BINDS_IN_FLIGHT
from extender.placement import Limits

log = logging.getLogger(__name__)


class ExtenderStartError(Exception):
    """A file, port or setting the extender needs at start is missing or unusable."""


def check_tls(cert: str | None, key: str | None, client_ca: str | None = None) -> None:
    """Raise `ExtenderStartError` unless the certificate and key (when given) load as TLS, and
    the client CA (when given) as certificates."""
    import ssl

    if not cert or not key:
        return
    files = [("--tls-cert", cert), ("--tls-key", key)]
    if client_ca:
        files.append(("--tls-client-ca", client_ca))
    for option, path in files:
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise ExtenderStartError(
                f"{option} {path}: cannot read it ({exc.strerror}); mount the serving "
                "certificate's secret there (manifests/scheduler/tls) or pass the right path"
            ) from None
    from extender.tlsfiles import tls_context

    try:
        tls_context(cert, key)
    except ssl.SSLError as exc:
        raise ExtenderStartError(
            f"--tls-cert {cert} / --tls-key {key} do not load as a certificate and its key "
            f"({exc.reason or exc})"
        ) from None
    if client_ca:
        try:
            tls_context(cert, key, client_ca)
        except ssl.SSLError as exc:
            raise ExtenderStartError(
                f"--tls-client-ca {client_ca} does not load as PEM CA certificates "
                f"({exc.reason or exc})"
            ) from None


@dataclass(frozen=True)
class Options:
    """What the command line decides."""

    kubeconfig: str | None
    host: str
    port: int
    limits: Limits
    tls_cert: str | None = None
    tls_key: str | None = None
    shutdown_grace: float = DEFAULT_GRACE_S
    binds_in_flight: int = BINDS_IN_FLIGHT
    dra: bool = False
    """Also watch ResourceClaims (the DRA path's placed pods and claim asks)."""
    tls_client_ca: str | None = None
    """With TLS: `/bind` only for clients whose certificate this CA signed."""


def run(options: Options) -> None:
    """Serve until SIGTERM or SIGINT; then finish open requests (bounded) and stop."""
    from baton.contract.kube import load_api_client
    from extender.app import create_app
    from extender.bind import Binder
    from extender.cache import DRA_KINDS, KINDS, KubeCache
    from extender.kubeapi import KubePodApi
    from extender.metrics import Metrics
    from extender.server import Server, bind_socket
    from extender.state import ClusterState

    check_tls(options.tls_cert, options.tls_key, options.tls_client_ca)
    api_client = load_api_client(options.kubeconfig)
    try:
        sock = bind_socket(options.host, options.port)
    except OSError as exc:  # the port taken or forbidden, else the host is not this machine's
        api_client.close()
        flag = "port" if exc.errno in (errno.EADDRINUSE, errno.EACCES) else "host"
        raise ExtenderStartError(
            f"cannot listen on {options.host}:{options.port} ({exc.strerror}); pass another "
            f"--{flag} (BATON_EXTENDER_{flag.upper()})"
        ) from None
    metrics = Metrics()
    state = ClusterState(options.limits, time.monotonic, dra=options.dra)
    cache = KubeCache(
        state,
        api_client,
        on_restart=lambda kind, why: metrics.watch_restarts.labels(kind).inc(),
        kinds=DRA_KINDS if options.dra else KINDS,
    )
    binder = Binder(cache, KubePodApi(api_client), time.time_ns)
    app = create_app(cache, binder, metrics, options.binds_in_flight)
    server = Server(
        app,
        options.tls_cert,
        options.tls_key,
        options.shutdown_grace,
        on_stop=binder.close,
        client_ca=options.tls_client_ca,
    )
    server.catch_stop_signals()  # from here on a stop signal ends the extender in order
    scheme = "https" if options.tls_cert else "http"
    log.info(
        "serving on %s://%s:%d%s, policy %s, max duty %g%%, memory headroom %d MiB, watching %s",
        scheme,
        options.host,
        sock.getsockname()[1],
        " (/bind for client certificates of --tls-client-ca only)" if options.tls_client_ca else "",
        options.limits.policy,
        options.limits.max_duty,
        options.limits.memory_headroom_mib,
        ", ".join(cache.kinds),
    )
    cache.start()
    try:
        server.run(sockets=[sock])
    finally:
        cache.stop()
        api_client.close()
    log.info("extender stopped on %s; watches closed", server.stop_signal or "request")

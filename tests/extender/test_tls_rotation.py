"""Certificates rotated where they are mounted are served without a restart."""

from __future__ import annotations

import logging
import os
import ssl
import time
from pathlib import Path

import httpx
import pytest

from extender.app import create_app
from extender.cache import ClusterCache
from extender.metrics import Metrics
from extender.placement import Limits
from extender.server import ServerThread
from extender.state import ClusterState
from tests.extender.builders import node
from tests.tlscerts import Authority

BIND = {"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "n1"}


def _install(pair: tuple[Path, Path], cert: Path, key: Path) -> None:
    """Put a new certificate and key in place as the kubelet does: each file replaced whole."""
    for source, target in zip(pair, (cert, key), strict=True):
        staged = target.with_suffix(".new")
        staged.write_bytes(source.read_bytes())
        os.replace(staged, target)


def _context(ca: Path, client: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        context.load_cert_chain(*map(str, client))
    return context


def test_a_renewed_certificate_and_client_ca_are_served_after_the_next_check(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old, new = Authority(tmp_path, "old CA"), Authority(tmp_path, "new CA")
    old_clients, new_clients = (
        Authority(tmp_path, "old clients"),
        Authority(tmp_path, "new clients"),
    )
    served = tmp_path / "served"
    served.mkdir()
    cert, key, client_ca = served / "tls.crt", served / "tls.key", served / "ca.crt"
    _install(old.issue("extender", ("127.0.0.1",)), cert, key)
    client_ca.write_bytes(old_clients.cert.read_bytes())
    scheduler = new_clients.issue("baton-scheduler", client=True)
    cache = ClusterCache.filled(ClusterState(Limits(), time.monotonic), [node("n1")], [])
    with ServerThread(
        create_app(cache, None, Metrics()),
        certfile=str(cert),
        keyfile=str(key),
        client_ca=str(client_ca),
    ) as s:
        url = f"https://127.0.0.1:{s.port}"
        tls = s.server.tls
        assert tls is not None
        assert not tls.check(), "nothing changed yet"
        with pytest.raises(httpx.ConnectError):  # the new CA's clients do not trust it yet
            httpx.get(f"{url}/healthz", verify=_context(new.cert), timeout=10)

        _install(new.issue("extender", ("127.0.0.1",)), cert, key)
        client_ca.write_bytes(new_clients.cert.read_bytes())
        with caplog.at_level(logging.INFO, logger="extender.tlsfiles"):
            assert tls.check()
        assert "loaded the changed TLS files" in caplog.text
        trust = _context(new.cert, scheduler)
        assert httpx.get(f"{url}/healthz", verify=trust, timeout=10).status_code == 200
        answer = httpx.post(f"{url}/bind", json=BIND, verify=trust, timeout=10)
        assert answer.status_code == 200, "the new client CA's certificate may bind"
        retired = _context(new.cert, old_clients.issue("baton-scheduler", client=True))
        with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
            httpx.post(f"{url}/bind", json=BIND, verify=retired, timeout=10)  # the old CA's

        # A key that does not match its certificate (caught half-renewed) is not loaded: the
        # certificate loaded before is served, and the files are tried again at the next check.
        key.write_bytes(old.issue("other")[1].read_bytes())
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="extender.tlsfiles"):
            assert not tls.check()
        assert "do not load" in caplog.text
        assert httpx.get(f"{url}/healthz", verify=_context(new.cert), timeout=10).status_code == 200
